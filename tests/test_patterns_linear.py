"""Regular-expression scopes: matched by RE2 only, in linear time, with Python's meaning.

Every scope is one RE2 program (google-re2 is a required dependency), so the shapes that make
a backtracking engine take exponential or polynomial time are answered on long hostile paths
by RE2. The pattern keeps the meaning Python's ``re`` and Django's ``re_path`` give it: Unicode
``\\d \\w \\s``, ``.`` stopping at a newline, and Django's anchoring (fullmatch for a pattern
ending with ``$``, search otherwise); what RE2 cannot run is refused at validation."""

from __future__ import annotations

import re
import string
from typing import Any

import pytest
import re2
from django.core.exceptions import ValidationError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_throttle.models import Rule
from django_throttle.patterns import (
    UnsafePattern,
    check_pattern,
    compile_scope,
    compile_scope_set,
    literal_prefix,
)
from django_throttle.rules import RuleSet, compile_rule
from tests.helpers import rule, statuses
from tests.test_admin import ADD, form_data

FAMILY = "^/" + "(?:a|)" * 26 + "a" * 26 + "$"  # issue 20's row 1

# pattern, [(path, whether it is in the scope)]: long paths built to make a backtracking
# engine try every way, the answer known by construction.
HOSTILE = [
    (
        FAMILY,
        [
            ("/" + "a" * 26, True),
            ("/" + "a" * 52, True),
            ("/" + "a" * 25, False),
            ("/" + "a" * 53, False),
            ("/" + "a" * 27 + "\n", False),  # ends with $: the whole path, newline included
            ("/" + "a" * 8000 + "!", False),
        ],
    ),
    (r"^/(a+)+$", [("/" + "a" * 8000, True), ("/" + "a" * 8000 + "!", False)]),
    (r"^/(a|aa)*$", [("/" + "a" * 8001, True), ("/" + "a" * 8000 + "!", False)]),
    (r"^/(a?)+$", [("/" + "a" * 8000, True), ("/" + "a" * 8000 + "b", False)]),
    (
        r"^/(.*a){20}",
        [("/" + "ba" * 20, True), ("/" + "a" * 19 + "b" * 8000, False), ("/" + "a" * 8000, True)],
    ),
    (
        r"^/(\w+\s?)*$",
        [
            ("/" + "ab " * 2700, True),
            ("/" + "é٣\xa0" * 2000, True),
            ("/" + "a" * 8000 + "!", False),
        ],
    ),
    (
        r"^/(a?(b?(c?)?)?)*d$",  # nested optional groups
        [("/" + "abc" * 2700 + "d", True), ("/" + "abc" * 2700 + "!", False)],
    ),
    (r"^/\d+\d+\d+x$", [("/" + "1" * 8000 + "x", True), ("/" + "1" * 8000 + "y", False)]),
    (r"^/users/\d+\d+/$", [("/users/" + "1" * 50_000 + "x", False), ("/users/12/", True)]),
    ("^/" + "a?" * 24 + "a" * 24 + "$", [("/" + "a" * 24, True), ("/" + "a" * 49, False)]),
    ("^/" + "a{0,16}" * 8 + "b", [("/" + "a" * 128 + "b", True), ("/" + "a" * 8000, False)]),
]


@pytest.mark.parametrize(("pattern", "cases"), HOSTILE, ids=[p[:24] for p, _ in HOSTILE])
def test_catastrophic_shapes_are_matched_by_re2_on_long_hostile_paths(
    pattern: str, cases: list[tuple[str, bool]]
) -> None:
    matcher = compile_scope(pattern)
    assert isinstance(matcher.regexp, re2._Regexp)  # RE2 decides, nothing else
    assert [matcher(path) for path, _ in cases] == [expected for _, expected in cases]
    # ... and so does the one program of a rule set holding them all.
    patterns = [p for p, _ in HOSTILE]
    match_all = compile_scope_set(patterns)
    index = patterns.index(pattern)
    assert [index in match_all(path) for path, _ in cases] == [expected for _, expected in cases]


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"^/(?=admin)", "lookarounds"),
        (r"^/(?<!x)a", "lookarounds"),
        (r"^/(\w)\1$", "backreferences"),
        (r"^/(?P<x>a)(?P=x)", "backreferences"),
        (r"^/(a)?(?(1)b|c)", "conditional groups"),
        (r"^/\bword", "word boundaries"),
        (r"^/a\B", "word boundaries"),
        (r"^/a$/b", r"\$ is supported only at the end"),
        (r"^/(\w{30}){30}", "too large"),
        (r"^/(a{1000}){1000}", "a repeat count is at most 1000"),
        (r"^/a{1001}", "a repeat count is at most 1000"),
        # Past what Python's parser can hold: OverflowError, not re.error (was a 500).
        (r"^/a{99999999999999999999}", "invalid regular expression"),
    ],
)
def test_what_re2_cannot_run_is_refused_with_a_message(
    admin_client: Any, pattern: str, why: str
) -> None:
    with pytest.raises(UnsafePattern, match=why):
        check_pattern(pattern)
    with pytest.raises(ValidationError, match="regular expression"):
        Rule(name="r", scope=pattern, limit=5).full_clean()
    response = admin_client.post(ADD, form_data(name="refused", scope=pattern))
    assert response.status_code == 200  # the form again, with the message; never a 500
    assert "Invalid regular expression" in response.content.decode()
    assert not Rule.objects.filter(name="refused").exists()


@pytest.mark.skipif(not hasattr(re, "NOFLAG"), reason="possessive repeats: Python 3.11+")
@pytest.mark.parametrize("pattern", [r"^/a*+a", r"^/(?>a+)a"])
def test_possessive_repeats_and_atomic_groups_are_refused(pattern: str) -> None:
    with pytest.raises(UnsafePattern, match="possessive|atomic"):
        check_pattern(pattern)


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        (r"^/users/\d+/$", "/users/٣/", True),  # ARABIC-INDIC DIGIT THREE
        (r"^/users/\d+/$", "/users/१२/", True),  # Devanagari
        (r"^/users/\d+/$", "/users/Ⅻ/", False),  # a numeral, not a decimal digit
        (r"^/users/\D+/$", "/users/٣/", False),
        (r"^/w/\w+$", "/w/café_٣", True),
        (r"^/w/\W$", "/w/é", False),
        (r"^/s/\s$", "/s/\xa0", True),  # NBSP
        (r"^/s/\s$", "/s/\u2028", True),  # LINE SEPARATOR
        (r"^/s/\S$", "/s/\u2028", False),
        (r"^/c/[\d-]+$", "/c/٣-٤", True),
        (r"^/c/[^\w]$", "/c/é", False),
        (r"^/c/[^\w]$", "/c/-", True),
        (r"^/dot/.$", "/dot/\n", False),
        (r"^/dot/.$", "/dot/\u2028", True),
        (r"(?s)^/dot/.$", "/dot/\n", True),
        (r"^/end$", "/end\n", False),  # ends with $: fullmatch, as Django routes it
        (r"^/x|^/end$", "/end\n", False),
        (r"^/end$|^/x", "/end\n", True),  # searched: $ holds before a final newline
        (r"^/end\Z", "/end\n", False),
        (r"^/end\Z", "/end", True),
        (r"^/api/", "/api/v1", True),  # no $: searched, anchored by its ^
        (r"^/a|/b", "/x/b", True),  # searched, as Django's re_path
        (r"^/(?:a$|b)", "/a\n", True),  # $ before a final newline, in a searched pattern
        (r"(?i)^/API/", "/api/", True),
        (r"(?i)^/k", "/\u212a", True),  # KELVIN SIGN is a k to Python's re
        (r"(?a)^/users/\d+/$", "/users/٣/", False),
        (r"(?a)^/v\d+\b", "/v2/x", True),
        (r"(?a)^/v\d+\b", "/v2x", False),
        (r"^/\ud800", "/\ud800", True),  # a lone surrogate: matched, never raised
        (r"^/.", "/\udfff", True),
    ],
)
def test_a_scope_means_what_it_means_to_python_and_django(
    pattern: str, path: str, expected: bool
) -> None:
    assert python_matches(pattern, path) == expected  # the reference
    assert bool(compile_scope(pattern)(path)) == expected
    assert (0 in compile_scope_set([pattern, r"^/never$"])(path)) == expected


def python_matches(pattern: str, path: str) -> bool:
    """Django's RegexPattern.match for an endpoint: fullmatch if it ends with $, else search."""
    compiled = re.compile(pattern)
    found = compiled.fullmatch(path) if pattern.endswith("$") else compiled.search(path)
    return found is not None


# -- Python's re and ours agree on random patterns and paths ------------------------------

ATOMS = [
    "a",
    "b",
    "/",
    "-",
    "٣",
    "é",
    "\xa0",
    "\\.",
    ".",
    "\\d",
    "\\w",
    "\\s",
    "\\D",
    "\\W",
    "\\S",
    "[ab]",
    "[\\d-]",
    "[^\\w]",
    "[^/]",
    "[a-zé]",
    "[\\s\\d]",
    "\\Z",
]
QUANTIFIERS = ["", "", "", "?", "*", "+", "{1,3}", "{2}", "*?", "+?"]


def atoms() -> st.SearchStrategy[str]:
    return st.sampled_from(ATOMS)


def sequences(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    piece = st.tuples(inner, st.sampled_from(QUANTIFIERS)).map(
        lambda pq: pq[0] + pq[1] if pq[0] != "\\Z" else pq[0]
    )
    return st.lists(piece, min_size=0, max_size=4).map("".join)


def groups(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(sequences(inner), min_size=1, max_size=3).map(
        lambda branches: "(?:" + "|".join(branches) + ")"
    ) | sequences(inner).map(lambda body: "(" + body + ")")


# Groups nest one deep: deeper nested repeats can keep Python's re, the reference, busy for
# minutes on a 12-character path (the very reason scopes are matched by RE2).
REGEXES = atoms() | groups(atoms())
PATTERNS = st.tuples(
    st.sampled_from(["", "", "(?i)", "(?s)", "(?m)", "(?a)"]),
    sequences(REGEXES),
    st.sampled_from(["", "$", "/$", "(?:/|$)"]),
).map(lambda parts: parts[0] + "^/" + parts[1] + parts[2])
PATHS = st.lists(
    st.sampled_from(["a", "b", "A", "/", "-", ".", "٣", "3", "é", "É", "\xa0", " ", "\u2028", "_"]),
    max_size=12,
).map(lambda chars: "/" + "".join(chars)) | st.tuples(
    st.text(alphabet=string.ascii_letters + "/٣é", max_size=8), st.sampled_from(["", "\n", "/\n"])
).map(lambda parts: "/" + parts[0] + parts[1])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=PATTERNS, paths=st.lists(PATHS, min_size=1, max_size=8))
def test_random_scopes_match_as_pythons_re(pattern: str, paths: list[str]) -> None:
    matcher = compile_scope(pattern)
    for path in paths:
        assert bool(matcher(path)) == python_matches(pattern, path), (pattern, path)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patterns=st.lists(PATTERNS, min_size=2, max_size=6), paths=st.lists(PATHS, max_size=6))
def test_a_set_of_scopes_matches_as_each_alone(patterns: list[str], paths: list[str]) -> None:
    match_all = compile_scope_set(patterns)
    for path in paths:
        expected = [i for i, p in enumerate(patterns) if python_matches(p, path)]
        assert match_all(path) == expected, (patterns, path)


# -- the rule set, and through the middleware --------------------------------------------


def test_a_rule_set_asks_only_the_regex_scopes_a_path_can_be_in() -> None:
    """A thousand regex scopes: a path runs only the group of scopes whose literal start it
    has (one RE2 set for a group of several), never every scope one by one."""
    asked: list[str] = []

    def counted(compiled: Any) -> Any:
        match = compiled.match

        def ask(path: str) -> bool:
            asked.append(compiled.name)
            return bool(match(path))

        object.__setattr__(compiled, "match", ask)
        return compiled

    regexes = [
        counted(compile_rule(Rule(pk=i, name=f"r{i}", scope=rf"^/r{i}/\d+/$", limit=5)))
        for i in range(1, 1001)
    ]
    get = counted(compile_rule(Rule(pk=2000, name="get", scope=r"^/r7/", methods="GET", limit=5)))
    anywhere = counted(compile_rule(Rule(pk=2001, name="any", scope=r"^/(?:r7|s)/", limit=5)))
    rules = RuleSet([*regexes, get, anywhere])
    assert sorted(r.name for r in rules.for_path("/r7/٣/", "GET")) == ["any", "get", "r7"]
    assert sorted(r.name for r in rules.for_path("/r7/٣/", "POST")) == ["any", "r7"]
    assert [r.name for r in rules.for_path("/r70/1/", "POST")] == ["r70"]
    assert rules.for_path("/r7/x/", "POST") == [anywhere]
    assert rules.for_path("/t/1/", "GET") == []
    # r7 and get share their literal start ("/r7/"): one set answers for both. "any" and
    # r70 are alone in theirs. No other scope was ever asked.
    assert set(asked) <= {"any", "r70"}


def test_the_literal_start_of_a_scope() -> None:
    assert literal_prefix(r"^/p7/\w+/$") == "/p7/"
    assert literal_prefix(r"\A/api/v\d") == "/api/v"
    assert literal_prefix(r"^/ab?c") == "/a"  # b is optional
    assert literal_prefix(r"^/a\.b") == "/a.b"
    assert literal_prefix(r"^/(a|b)/") == "/"
    assert literal_prefix(r"/x") == ""  # searched: it may match anywhere in the path
    assert literal_prefix(r"(?i)^/ab") == ""  # /AB is in it too
    assert literal_prefix(r"(?m)^/ab") == ""  # after a newline too


@pytest.mark.django_db
@pytest.mark.usefixtures("throttle_middleware")
def test_a_unicode_digit_is_counted_by_a_digits_scope(client: Any) -> None:
    """Issue 20's row 3: with RE2, \\d was ASCII only and /users/٣/ was never counted."""
    rule("users", r"^/users/\d+/$", 1)
    assert statuses(client, "/users/٣/", 3) == [404, 429, 429]  # counted before routing
    assert statuses(client, "/users/12/", 1) == [429]  # the same client, the same rule


def test_compiling_scopes_never_touches_the_process_warning_filters(monkeypatch: Any) -> None:
    """Rules are compiled beside requests (a reload runs in a thread of its own); warning
    filters are the whole process's, so compiling must not turn other threads' warnings into
    errors. Only validation, when a rule is saved, refuses what Python warns about."""
    import warnings

    def touched(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a warning filter was changed while compiling scopes")

    monkeypatch.setattr(warnings, "simplefilter", touched)
    monkeypatch.setattr(warnings, "filterwarnings", touched)
    scopes = [rf"^/never-seen-{i}/\d+/$" for i in range(3)]  # not in any cache yet
    rules = RuleSet(
        [compile_rule(Rule(pk=i, name=f"w{i}", scope=s, limit=5)) for i, s in enumerate(scopes)]
    )
    assert [r.name for r in rules.for_path("/never-seen-1/7/", "GET")] == ["w1"]
