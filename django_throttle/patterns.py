r"""Regular-expression scopes that no path can make slow.

A scope's pattern is matched against the path of every request, 404s included, so a
pattern that backtracks (``^/(a+)+$``: 24 ``a`` took 0.9 s of a worker) lets anyone stall
the site. Two guards, both always on:

- Validation refuses the constructs behind catastrophic backtracking: a repeated group
  whose body can itself match in several ways (a nested quantifier, ``(a+)+``, or an
  alternation, ``(a|aa)*``); more than ``MAX_OPEN_REPEATS`` open-ended repeats (``+``,
  ``*``, ``{n,}`` or a bound above ``OPEN_ABOVE``: three in a row, ``\d+\d+\d+x``, take
  time in the cube of the length); and the constructs RE2 lacks (lookarounds,
  backreferences). The rules do not depend on the install: a pattern valid on one
  machine is valid on every other.
- Matching runs on RE2 (google-re2, the ``[re2]`` extra) when it is installed: linear in
  the path's length. Without it, Python's ``re`` matches the first ``MAX_MATCHED_PATH``
  characters of the path, so the worst a valid pattern can take is quadratic in 1024.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

try:  # Python 3.11+
    from re import _constants as sre_constants  # type: ignore[attr-defined]
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants
    import sre_parse

try:
    import re2
except ImportError:  # pragma: no cover - depends on the install
    re2 = None

MAX_MATCHED_PATH = 1024  # characters of a path Python's re looks at, without RE2
MAX_OPEN_REPEATS = 2
MAX_VARIABLE_REPEATS = 3  # repeats of any variable count (a?, a{0,5}, a+): each multiplies the ways
OPEN_ABOVE = 16  # a repeat allowing more than this many is open-ended

_REPEATS = {sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT}
_REFUSED = {
    sre_constants.ASSERT: "lookarounds ((?=...), (?!...), (?<=...), (?<!...))",
    sre_constants.ASSERT_NOT: "lookarounds ((?=...), (?!...), (?<=...), (?<!...))",
    sre_constants.GROUPREF: "backreferences (\\1)",
    sre_constants.GROUPREF_EXISTS: "conditional groups ((?(1)...))",
}
_POSSESSIVE = getattr(sre_constants, "POSSESSIVE_REPEAT", None)
_ATOMIC = getattr(sre_constants, "ATOMIC_GROUP", None)


class UnsafePattern(ValueError):
    """A scope pattern that cannot be used; the message says why, for the admin."""


Matcher = Callable[[str], Any]


def engine() -> str:
    return "re2" if re2 is not None else "re"


def check_pattern(pattern: str) -> None:
    """Raise UnsafePattern if ``pattern`` is not a usable scope."""
    try:
        with warnings.catch_warnings():
            # "Possible nested set" and the like: a pattern whose meaning Python will
            # change is refused, rather than raised from the admin under -W error.
            warnings.simplefilter("error")
            parsed = sre_parse.parse(pattern)
    except (re.error, Warning) as exc:
        raise UnsafePattern(f"invalid regular expression: {exc}") from None
    open_repeats: list[int] = []
    variable_repeats: list[int] = []
    _walk(parsed, open_repeats, variable_repeats)
    if len(variable_repeats) > MAX_VARIABLE_REPEATS:
        raise UnsafePattern(
            f"at most {MAX_VARIABLE_REPEATS} repeats of variable count (?, *, +, {{m,n}}) are "
            "allowed in a scope (each multiplies the ways a path can be tried); use a path "
            "prefix or a scope name for this route"
        )
    if len(open_repeats) > MAX_OPEN_REPEATS:
        raise UnsafePattern(
            f"at most {MAX_OPEN_REPEATS} open-ended repeats (+, *, {{n,}}) are allowed in a "
            "scope (more can take time in a power of the path's length); use a path prefix "
            "or a scope name for this route"
        )


def _walk(items: Any, open_repeats: list[int], variable_repeats: list[int]) -> bool:
    """Refuse what cannot be matched safely; return whether ``items`` can match in more than
    one way (a repeat of variable count, or an alternation). Open-ended repeats are
    appended to ``open_repeats``."""
    variable = False
    for op, av in items:
        if op in _REFUSED:
            raise UnsafePattern(f"{_REFUSED[op]} are not allowed in a scope")
        if op in _REPEATS or op == _POSSESSIVE:
            low, high, body = av
            if high > OPEN_ABOVE:
                open_repeats.append(high)
            if low != high:
                variable_repeats.append(high)
            body_variable = _walk(body, open_repeats, variable_repeats)
            if high > 1 and body_variable:
                raise UnsafePattern(
                    "a repeated group whose body can also vary (a nested quantifier such as "
                    "(a+)+ or a repeated alternation such as (a|b)+) can take exponential time "
                    "on a crafted path; write it without the nesting, e.g. [ab]+"
                )
            variable = variable or low != high or body_variable
        elif op == sre_constants.BRANCH:
            for branch in av[1]:
                _walk(branch, open_repeats, variable_repeats)
            variable = True
        elif op == sre_constants.SUBPATTERN:
            variable = _walk(av[-1], open_repeats, variable_repeats) or variable
        elif op == _ATOMIC:
            variable = _walk(av, open_repeats, variable_repeats) or variable
    return variable


def compile_scope(pattern: str) -> Matcher:
    """A function matching a path against ``pattern`` (anchored at the start, as re.match);
    raises UnsafePattern."""
    check_pattern(pattern)
    if re2 is not None:
        try:
            return re2.compile(pattern).match  # type: ignore[no-any-return]
        except re2.error as exc:  # a construct the checks above do not know
            raise UnsafePattern(f"not supported by RE2: {exc}") from None
    match = re.compile(pattern).match

    def bounded(path: str) -> Any:
        return match(path[:MAX_MATCHED_PATH])

    return bounded
