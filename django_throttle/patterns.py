"""Regular-expression scopes in Python's syntax, matched by RE2 in time linear in the path.

A scope is matched against every path, 404s included: it must never backtrack (docs/bounds.md).
"""

from __future__ import annotations

import array
import functools
import importlib
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from types import MappingProxyType
from typing import Any

import re2

try:  # Python 3.11+
    from re import _constants as sre_constants  # type: ignore[attr-defined]
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants
    import sre_parse

_sre: Any = importlib.import_module("_sre")  # sre's case mappings, as its compiler uses them

# Bytes RE2 may use for one scope, its program and its DFA's cache: RE2's own default, so what
# RE2 compiled before it was required still compiles (a Unicode class is bigger than RE2's
# ASCII one, so a class repeated a thousand times no longer fits).
MAX_MEM = 8 << 20
MAX_SET_MEM = 64 << 20  # the same, for the one program matching every regex scope of a rule set
MAX_CODE_POINT = 0x10FFFF

Ranges = tuple[tuple[int, int], ...]  # disjoint, sorted, inclusive ranges of code points

_C = sre_constants
_IGNORECASE = _C.SRE_FLAG_IGNORECASE
_MULTILINE = _C.SRE_FLAG_MULTILINE
_DOTALL = _C.SRE_FLAG_DOTALL
_ASCII = _C.SRE_FLAG_ASCII
_LOOKAROUND = "lookarounds ((?=...), (?!...), (?<=...), (?<!...))"
_REFUSED = MappingProxyType(
    {
        _C.ASSERT: _LOOKAROUND,
        _C.ASSERT_NOT: _LOOKAROUND,
        _C.GROUPREF: "backreferences (\\1, (?P=name))",
        _C.GROUPREF_EXISTS: "conditional groups ((?(1)...))",
        **{
            getattr(_C, name): what
            for name, what in (
                ("POSSESSIVE_REPEAT", "possessive repeats (a*+, a++, a?+)"),
                ("ATOMIC_GROUP", "atomic groups ((?>...))"),
            )
            if hasattr(_C, name)  # Python 3.11+
        },
    }
)
_CATEGORIES = MappingProxyType(
    {  # sre's category -> (the class in Python's syntax, negated)
        _C.CATEGORY_DIGIT: ("\\d", False),
        _C.CATEGORY_NOT_DIGIT: ("\\d", True),
        _C.CATEGORY_SPACE: ("\\s", False),
        _C.CATEGORY_NOT_SPACE: ("\\s", True),
        _C.CATEGORY_WORD: ("\\w", False),
        _C.CATEGORY_NOT_WORD: ("\\w", True),
    }
)
_CLASS_OPS = frozenset({_C.LITERAL, _C.NOT_LITERAL, _C.ANY, _C.IN})
_REPEATS = frozenset({_C.MAX_REPEAT, _C.MIN_REPEAT})


class UnsafePattern(ValueError):
    """A scope pattern that cannot be used; the message says why, for the admin."""


Matcher = Callable[[str], bool]


class ScopeMatcher:
    """Whether a path is in a regular-expression scope, decided by one RE2 program."""

    __slots__ = ("pattern", "regexp")

    def __init__(self, pattern: str, regexp: Any) -> None:
        self.pattern = pattern
        self.regexp = regexp  # a compiled re2 object

    def __call__(self, path: str) -> bool:
        # surrogatepass: a path holding a lone surrogate (a test client, an odd server) is
        # matched as its code points are, by the classes spelled out below, never raised.
        return self.regexp.search(path.encode("utf-8", "surrogatepass")) is not None

    def __repr__(self) -> str:
        return f"ScopeMatcher({self.pattern!r})"


def check_pattern(pattern: str) -> None:
    """Raise UnsafePattern if ``pattern`` is not a usable scope (when a rule is saved: also a
    pattern whose meaning Python will change, which it warns about)."""
    try:
        with warnings.catch_warnings():
            # "Possible nested set" and the like: refused, rather than raised from the admin
            # under -W error. Only here: warning filters are the whole process's, and a
            # reload runs beside requests.
            warnings.simplefilter("error")
            sre_parse.parse(pattern)
    except (*_PARSE_ERRORS, Warning) as exc:
        raise UnsafePattern(f"invalid regular expression: {exc}") from None
    compile_scope(pattern)


def compile_scope(pattern: str) -> ScopeMatcher:
    """The matcher of one scope (fullmatch if ``pattern`` ends with ``$``, else search, as
    Django's re_path); raises UnsafePattern."""
    return ScopeMatcher(pattern, _compile(translate(pattern), MAX_MEM))


def compile_scope_set(
    patterns: Sequence[str], matchers: Sequence[Matcher] | None = None
) -> Callable[[str], list[int]]:
    """One matcher for many scopes: the indices of ``patterns`` that match a path (each
    anchored as compile_scope anchors it), found in one pass of RE2 over the path.
    ``matchers``: compile_scope() of each pattern, if the caller has them already."""
    sources = [translate(p) for p in patterns]
    if not sources:
        return lambda path: []
    singles: list[Matcher] = (
        list(matchers) if matchers is not None else [compile_scope(p) for p in patterns]
    )

    def one_by_one(path: str) -> list[int]:
        return [i for i, match in enumerate(singles) if match(path)]

    if len(singles) == 1:
        return one_by_one
    regexps = re2.Set.SearchSet(_options(MAX_SET_MEM))
    for source in sources:
        regexps.Add(source)
    # A set's DFA cannot fall back to the NFA as one RE2 does: out of memory it answers no
    # match at all. A pattern matching every path tells that apart from "none of them".
    everything = regexps.Add("")
    try:
        regexps.Compile()
    except re2.error:  # more than MAX_SET_MEM: still linear, one program per scope
        return one_by_one
    set_match = regexps.Match

    def match(path: str) -> list[int]:
        found = set_match(path.encode("utf-8", "surrogatepass"))
        if found is None:
            return one_by_one(path)
        found.remove(everything)
        found.sort()
        return found  # type: ignore[no-any-return]

    return match


def _options(max_mem: int) -> Any:
    options = re2.Options()
    options.max_mem = max_mem
    options.log_errors = False  # a refused pattern is reported to the admin, not to stderr
    options.never_capture = True
    return options


def _compile(source: str, max_mem: int) -> Any:
    try:
        return re2.compile(source, _options(max_mem))
    except re2.error as exc:
        message = str(exc.args[0] if exc.args else exc)
        if message.startswith("b'") or message.startswith('b"'):
            message = message[2:-1]
        if "too large" in message or "out of memory" in message:
            raise UnsafePattern(
                f"the pattern is too large to be matched within {max_mem >> 20} MiB; "
                "use smaller repeat counts, a path prefix or a scope name"
            ) from None
        if "repetition" in message:
            raise UnsafePattern(
                f"{message}: a repeat count is at most 1000, nested repeats multiplied"
            ) from None
        raise UnsafePattern(f"not supported: {message}") from None


def literal_prefix(pattern: str) -> str:
    """The text every path in the scope starts with: the literal characters right after a
    leading ``^`` or ``\\A`` ("" when there are none, or the pattern may match elsewhere)."""
    try:
        parsed = _parse(pattern)
    except UnsafePattern:
        return ""
    if parsed.state.flags & (_IGNORECASE | _MULTILINE):
        return ""
    items = list(parsed)
    if not items or items[0] not in ((_C.AT, _C.AT_BEGINNING), (_C.AT, _C.AT_BEGINNING_STRING)):
        return ""
    prefix = []
    for op, av in items[1:]:
        if op != _C.LITERAL:
            break
        prefix.append(chr(av))
    return "".join(prefix)


# What Python's parser raises for a pattern it cannot read (OverflowError: a repeat count
# past its limit, ^/a{99999999999999999999}).
_PARSE_ERRORS = (re.error, RecursionError, OverflowError, ValueError)


@functools.lru_cache(maxsize=4096)
def _parse(pattern: str) -> Any:
    """Python's parse of a pattern. No warning filter is touched: they are the process's, and
    rules are compiled beside requests; a pattern Python warns about was refused when saved
    (and under -W error, its warning is caught here as the pattern's fault)."""
    try:
        return sre_parse.parse(pattern)
    except (*_PARSE_ERRORS, Warning) as exc:
        raise UnsafePattern(f"invalid regular expression: {exc}") from None


@functools.lru_cache(maxsize=4096)
def translate(pattern: str) -> str:
    """``pattern`` (Python's syntax) in RE2's syntax, with the same meaning and anchoring."""
    parsed = _parse(pattern)
    # Django's RegexPattern.match: fullmatch when the pattern ends with "$", else search.
    whole = pattern.endswith("$")
    try:
        body = _Translator(whole).sequence(list(parsed), parsed.state.flags, tail=True)
    except RecursionError:
        raise UnsafePattern("the pattern is nested too deeply") from None
    return f"\\A(?:{body})\\z" if whole else body


class _Translator:
    """Python's parse tree of a pattern, written out in RE2's syntax."""

    def __init__(self, whole: bool) -> None:
        self.whole = whole

    def sequence(self, items: list[Any], flags: int, tail: bool) -> str:
        """``tail``: nothing can follow the last item (the ``$`` at the end of a pattern)."""
        last = len(items) - 1
        return "".join(
            self.item(op, av, flags, tail and i == last) for i, (op, av) in enumerate(items)
        )

    def item(self, op: Any, av: Any, flags: int, tail: bool) -> str:
        if op in _REFUSED:
            raise UnsafePattern(f"{_REFUSED[op]} are not supported in a scope")
        if op in _CLASS_OPS:
            return _spell(_class_of(op, av, flags))
        if op in _REPEATS:
            low, high, body = av
            inner = self.sequence(list(body), flags, tail and high <= 1)
            top = "" if high == _C.MAXREPEAT else str(high)
            count = f"{{{low}}}" if low == high else f"{{{low},{top}}}"
            return f"(?:{inner}){count}" + ("?" if op == _C.MIN_REPEAT else "")
        if op == _C.SUBPATTERN:
            _group, add, remove, body = av
            return "(?:" + self.sequence(list(body), (flags | add) & ~remove, tail) + ")"
        if op == _C.BRANCH:
            branches = (self.sequence(list(b), flags, tail) for b in av[1])
            return "(?:" + "|".join(branches) + ")"
        if op == _C.AT:
            return self.at(av, flags, tail)
        raise UnsafePattern(f"{op} is not supported in a scope")  # pragma: no cover

    def at(self, where: Any, flags: int, tail: bool) -> str:
        if where == _C.AT_BEGINNING:
            return "(?m:^)" if flags & _MULTILINE else "\\A"
        if where == _C.AT_BEGINNING_STRING:
            return "\\A"
        if where == _C.AT_END_STRING:
            return "\\z"
        if where == _C.AT_END:
            if flags & _MULTILINE:
                return "(?m:$)"  # before any newline or at the end: the same in both engines
            if not tail:
                # Python's $ also holds before a final newline, which RE2 cannot say
                # anywhere but at the end.
                raise UnsafePattern(
                    "$ is supported only at the end of a scope (or of each alternative); "
                    "use \\Z for the end of the path"
                )
            # At the end nothing follows, so "before a final newline" is "then an optional
            # newline"; a pattern ending with $ is matched whole, and there $ is the end.
            return "\\z" if self.whole else "(?:\\n?\\z)"
        if where in (_C.AT_BOUNDARY, _C.AT_NON_BOUNDARY):
            if flags & _ASCII:
                return "\\b" if where == _C.AT_BOUNDARY else "\\B"
            raise UnsafePattern(
                "word boundaries (\\b, \\B) are not supported in a scope: RE2 only knows ASCII "
                "word characters. Start the pattern with (?a) if ASCII words are meant, or "
                "write the boundary as characters, e.g. (?:/|$)"
            )
        raise UnsafePattern(f"{where} is not supported in a scope")  # pragma: no cover


# -- character classes ----------------------------------------------------------------------


def _class_of(op: Any, av: Any, flags: int) -> Ranges:
    """The code points Python's re matches with this one-character item under ``flags``."""
    key = (op, _freeze(av), flags & (_IGNORECASE | _DOTALL | _ASCII))
    return _class_cached(key)


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


@functools.lru_cache(maxsize=4096)
def _class_cached(key: tuple[Any, Any, int]) -> Ranges:
    op, av, flags = key
    ascii_ = bool(flags & _ASCII)
    if op == _C.LITERAL:
        exact: Ranges = ((av, av),)
    elif op == _C.NOT_LITERAL:
        exact = _complement(((av, av),))
    elif op == _C.ANY:
        exact = ((0, MAX_CODE_POINT),) if flags & _DOTALL else _complement(((10, 10),))
    else:
        parts: list[Ranges] = []
        negate = False
        for item_op, item_av in av:
            if item_op == _C.NEGATE:
                negate = True
            elif item_op == _C.LITERAL:
                parts.append(((item_av, item_av),))
            elif item_op == _C.RANGE:
                parts.append((tuple(item_av),))
            elif item_op == _C.CATEGORY:
                name, negated = _CATEGORIES[item_av]
                ranges = _category(name, ascii_)
                parts.append(_complement(ranges) if negated else ranges)
            else:  # pragma: no cover - sre_parse puts nothing else in a class
                raise UnsafePattern(f"{item_op} is not supported in a character class")
        exact = _union(parts)
        if negate:
            exact = _complement(exact)
    if not flags & _IGNORECASE:
        return exact
    # Ignoring case changes the answer only for the code points that have a case or are
    # another's case: ask Python's re about those, the rest keep the answer above.
    cased, cased_ranges = _cased()
    source = _python_source(op, av)
    prefix = "(?" + ("a" if ascii_ else "") + "i" + ("s" if flags & _DOTALL else "") + ")"
    hits = [ord(m.group()) for m in re.finditer(prefix + source, cased)]
    return _union([_difference(exact, cased_ranges), tuple((c, c) for c in hits)])


def _python_source(op: Any, av: Any) -> str:
    if op == _C.LITERAL:
        return _py_char(av)
    if op == _C.NOT_LITERAL:
        return "[^" + _py_char(av) + "]"
    if op == _C.ANY:
        return "."
    out = []
    for item_op, item_av in av:
        if item_op == _C.NEGATE:
            out.append("^")
        elif item_op == _C.LITERAL:
            out.append(_py_char(item_av))
        elif item_op == _C.RANGE:
            out.append(_py_char(item_av[0]) + "-" + _py_char(item_av[1]))
        else:
            name, negated = _CATEGORIES[item_av]
            out.append(name.upper() if negated else name)
    return "[" + "".join(out) + "]"


def _py_char(code: int) -> str:
    return f"\\U{code:08x}"


def _category(name: str, ascii_: bool) -> Ranges:
    """The code points Python's ``\\d``, ``\\w`` or ``\\s`` matches, asked of Python's re."""
    return _categories()[name, ascii_]


@functools.cache
def _categories() -> dict[tuple[str, bool], Ranges]:
    # Every code point in one string (4 MB, dropped once scanned), as UTF-32 decodes it.
    every = array.array("I", range(MAX_CODE_POINT + 1)).tobytes()
    text = every.decode("utf-32-le", "surrogatepass")
    found = {}
    for name in ("\\d", "\\w", "\\s"):
        for ascii_ in (False, True):
            runs = re.finditer(("(?a)" if ascii_ else "") + name + "+", text)
            found[name, ascii_] = tuple((m.start(), m.end() - 1) for m in runs)
    return found


@functools.cache
def _cased() -> tuple[str, Ranges]:
    """Every code point that has a case or is the simple lower case of one: under IGNORECASE
    sre compares lower cases (and upper ones, which only cased code points change)."""
    found: set[int] = set()
    for code in range(MAX_CODE_POINT + 1):
        if _sre.unicode_iscased(code):
            found.update((code, _sre.unicode_tolower(code)))
    codes = sorted(found)
    return "".join(map(chr, codes)), _union([tuple((c, c) for c in codes)])


def _union(parts: Iterable[Ranges]) -> Ranges:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(r for part in parts for r in part):
        if merged and low <= merged[-1][1] + 1:
            if high > merged[-1][1]:
                merged[-1] = (merged[-1][0], high)
        else:
            merged.append((low, high))
    return tuple(merged)


def _complement(ranges: Ranges) -> Ranges:
    out = []
    start = 0
    for low, high in ranges:
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return tuple(out)


def _difference(ranges: Ranges, remove: Ranges) -> Ranges:
    return _complement(_union([_complement(ranges), remove]))


@functools.lru_cache(maxsize=4096)
def _spell(ranges: Ranges) -> str:
    """A class of code points in RE2's syntax."""
    if not ranges:
        return "[^\\x{0}-\\x{10ffff}]"  # matches nothing
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return f"\\x{{{ranges[0][0]:x}}}"
    return "[" + "".join(_spell_range(low, high) for low, high in ranges) + "]"


def _spell_range(low: int, high: int) -> str:
    if low == high:
        return f"\\x{{{low:x}}}"
    return f"\\x{{{low:x}}}-\\x{{{high:x}}}"
