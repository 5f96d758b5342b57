"""Hostile input, generated: headers, addresses, X-Forwarded-For chains, paths, methods and rule
definitions. Nothing escapes the middleware, every Redis key is short and expires, the memory
store stays bounded, and validation accepts exactly the rules the contract allows."""

from __future__ import annotations

import re
import string
import warnings
from typing import Any
from urllib.parse import urlencode

import pytest
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.test import RequestFactory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_throttle.middleware import ThrottleMiddleware
from django_throttle.models import Rule
from django_throttle.runtime import replace_runtime
from django_throttle.store import Check, MemoryStore
from tests.engine_helpers import ALGORITHMS, make_rule
from tests.helpers import rule

try:  # Python 3.11+
    from re import _constants as sre_constants  # type: ignore[attr-defined]
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_constants
    import sre_parse

pytestmark = pytest.mark.django_db

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MAX_KEY_LENGTH = 64

# -- strategies ---------------------------------------------------------------------------

# Anything but NUL (which no HTTP header can carry) and lone surrogates (not text).
CHARS = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))
TCHARS = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"


def _repeated(unit: st.SearchStrategy[str], up_to: int) -> st.SearchStrategy[str]:
    """Long values without asking Hypothesis for that much entropy: a unit, repeated."""
    return st.tuples(unit, st.integers(1, up_to)).map(lambda t: (t[0] * t[1])[:up_to])


header_values = st.one_of(
    st.text(CHARS, max_size=60),
    _repeated(st.text(CHARS, min_size=1, max_size=8), 10_240),  # up to 10 KB
    st.sampled_from(["", " ", "a\r\nX-Injected: 1", "\r\n\r\n", "é\u2028\u0085", "\t"]),
)

ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
ports = st.integers(0, 65535)
addresses = st.one_of(
    ipv4,
    ipv6,
    ipv4.map(lambda a: f"::ffff:{a}"),  # v4-mapped
    st.tuples(ipv6, st.text(string.ascii_letters + string.digits, min_size=1, max_size=8)).map(
        lambda t: f"{t[0]}%{t[1]}"  # zone id, as fe80::1%eth0
    ),
    st.tuples(ipv4, ports).map(lambda t: f"{t[0]}:{t[1]}"),
    st.tuples(ipv6, st.none() | ports).map(
        lambda t: f"[{t[0]}]" + ("" if t[1] is None else f":{t[1]}")
    ),
    st.sampled_from(
        ["", " ", "unknown", "999.1.1.1", "1.2.3", "::::", "[", "]:80", "[::1", "1.2.3.4:abc"]
        + ["fe80::1%", "%eth0", "1.2.3.4 5.6.7.8", "[1.2.3.4]", "::ffff:999.1.1.1", "0x7f.1"]
    ),
    st.text(CHARS, max_size=40),
)
forwarded_chains = st.one_of(
    st.lists(addresses, max_size=30).map(", ".join),
    st.lists(addresses, max_size=30).map(",".join),
    st.tuples(addresses, st.integers(0, 5000)).map(lambda t: ",".join([t[0]] * t[1])),  # absurd
    header_values,
)
paths = st.one_of(
    st.text(st.characters(min_codepoint=0x20, blacklist_categories=("Cs",)), max_size=120).map(
        lambda p: "/" + p
    ),
    st.lists(st.integers(0, 255), max_size=40).map(
        lambda bs: "/" + "".join(f"%{b:02X}" for b in bs)  # percent-encoded junk
    ),
    st.sampled_from(["/", "/api/items/", "/users/1/", "/%", "/%zz/%E9%", "/a%00b", "//x/../.."]),
)
methods = st.one_of(
    st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]),
    st.sampled_from(["PROPFIND", "MKCOL", "M-SEARCH", "BREW", "VERSION-CONTROL", "get"]),
    st.text(TCHARS, min_size=1, max_size=12),
)


@st.composite
def requests(draw: Any) -> dict[str, Any]:
    """One request's method, path and environ extras."""
    extra: dict[str, Any] = {}
    for key, values in [
        ("REMOTE_ADDR", addresses),
        ("HTTP_X_FORWARDED_FOR", forwarded_chains),
        ("HTTP_X_API_KEY", header_values),
        ("HTTP_X_TENANT", header_values),
        ("HTTP_USER_AGENT", header_values),
    ]:
        if draw(st.booleans()):
            extra[key] = draw(values)
    param = draw(st.none() | header_values)
    method = draw(methods)
    if param is not None:
        extra["QUERY_STRING"] = urlencode({"q": param})
        if method.upper() == "POST":
            extra["data"] = urlencode({"q": param})
            extra["content_type"] = "application/x-www-form-urlencoded"
    return {"method": method, "path": draw(paths), "extra": extra}


# -- the rules every request is fuzzed against ------------------------------------------------


@pytest.fixture
def every_kind_of_rule(settings: Any, throttle_middleware: None) -> None:
    """Rules of every key kind, algorithm, scope form and action; some tight enough to reject."""
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "TRUSTED_PROXIES": 2}
    rule("ip", "*", 1000, algorithm="token_bucket", burst=2000)
    rule("user or ip", "*", 1000, key_kind="user_or_ip")
    rule("header", "*", 1000, key_kind="header", key_arg="X-Api-Key", algorithm="fixed_window")
    rule("param", "/", 1000, key_kind="param", key_arg="q", algorithm="sliding_window_log")
    rule("tenant", "*", 1000, key_kind="custom", key_arg="tenant", algorithm="leaky_bucket")
    rule("shared", r"^/[^/]*$", 5, key_kind="global", action="log")
    rule("propfind", "/", 2, methods="PROPFIND,BREW", algorithm="fixed_window")
    rule("queue", r"^/(api|users)/", 1000, unit="second", algorithm="leaky_bucket", burst=5)
    rule(
        "queue-delay",
        "plain",
        1000,
        unit="second",
        algorithm="leaky_bucket",
        action="delay",
        burst=5,
    )


def assert_keys_expire_and_are_short(redis_client: Any) -> None:
    keys = list(redis_client.scan_iter(count=1000))
    assert len(keys) > 1  # the fuzzed requests were counted
    for key in keys:
        assert len(key) <= MAX_KEY_LENGTH, key
        # -1 is a key without expiry; -2 (expired since the scan) and 0 (expiring in this
        # millisecond: per-second rules have short lives) are keys that did expire.
        assert redis_client.pttl(key) != -1, key


@pytest.mark.usefixtures("every_kind_of_rule")
def test_fuzzed_requests_never_escape_the_middleware(client: Any, redis_client: Any) -> None:
    @settings(FUZZ, max_examples=150)
    @given(requests())
    def one(request: dict[str, Any]) -> None:
        response = client.generic(request["method"], request["path"], **request["extra"])
        assert response.status_code < 500, request

    one()
    assert_keys_expire_and_are_short(redis_client)


@pytest.mark.usefixtures("every_kind_of_rule")
def test_fuzzed_requests_without_remote_addr(redis_client: Any) -> None:
    middleware = ThrottleMiddleware(lambda request: HttpResponse("ok"))
    factory = RequestFactory()

    @settings(FUZZ, max_examples=80)
    @given(requests(), st.sampled_from(["delete", "empty"]))
    def one(request: dict[str, Any], remote: str) -> None:
        extra = {k: v for k, v in request["extra"].items() if k != "REMOTE_ADDR"}
        django_request = factory.generic(request["method"], request["path"], **extra)
        if remote == "delete":
            del django_request.META["REMOTE_ADDR"]
        else:
            django_request.META["REMOTE_ADDR"] = ""
        response = middleware(django_request)
        assert response.status_code in (200, 429), request

    one()
    assert_keys_expire_and_are_short(redis_client)


# -- rule definitions ---------------------------------------------------------------------------

KEY_KINDS = ["ip", "user", "user_or_ip", "header", "param", "global", "custom"]
UNITS = ["second", "minute", "hour", "day"]
ACTIONS = ["reject", "delay", "log"]
FAIL_MODES = ["default", "open", "closed"]
MAX_LIMIT = 1_000_000_000
KEY_FUNCTIONS = {"tenant"}  # tests/settings.py

scopes = st.one_of(
    st.sampled_from(["*", "/", "/api/", "/api /x", "login", "shop:cart", "a.b-c_d", "ß"]),
    st.sampled_from([r"^/users/\d+/$", "^", "^(?P<pk>[0-9]+)", r"^\w+$", "^a{2}"]),  # regexes
    st.sampled_from(["^(", "^[a-", "^a{2,1}", "^(?P<x>a)(?P<x>b)", "^*", "^\\", "^[[a]"]),
    st.sampled_from(  # what Python compiles and RE2 cannot run, and its allowed neighbours
        [r"^/(?=a)", r"^/(?<!a)b", r"^(a)\1", r"^(a)?(?(1)b)", r"^/\bx", r"^(?a)/\bx", "^$0"]
        + [r"^/a$|^/b$", r"^/(a$)?", r"^/(a$)*", r"^(?m)/a$/b", r"^/(a{40}){25}", r"^/a{1001}"]
        + [r"^/(a{40}){26}", r"^/((?a:\b)x)", r"^/a{1000}", r"^/(?:a$|b)c"]
    ),
    st.sampled_from(["", " ", "**", "*login", "two words", "tab\there", " login ", "\u2003x"]),
    st.tuples(st.sampled_from(["", "/", "^", "*"]), st.text(CHARS, max_size=20)).map("".join),
    st.text(CHARS, min_size=250, max_size=260),  # around max_length
)
key_args = st.one_of(
    st.sampled_from(["", "X-Api-Key", "q", "tenant", " tenant ", "nope", "Bad Header", "X:Y"]),
    st.text(CHARS, max_size=12),
)
method_lists = st.one_of(
    st.sampled_from(["", "GET", "get,post", "POST, PUT", "GET,,POST", " , ", "G3T", "P*ST"]),
    st.sampled_from(["GET POST", "POST;PUT", "PROPFIND", "poſt", "M-SEARCH"]),
    st.text(CHARS, max_size=12),
)
limits = st.one_of(
    st.integers(-3, 5), st.integers(MAX_LIMIT - 2, MAX_LIMIT + 2), st.integers(1, 10_000)
)


def _choice(valid: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(valid), st.sampled_from(["", "bogus", valid[0].upper()]))


ANY_FIELD: dict[str, st.SearchStrategy[Any]] = {
    "scope": scopes,
    "methods": method_lists,
    "key_kind": _choice(KEY_KINDS),
    "key_arg": key_args,
    "limit": limits,
    "unit": _choice(UNITS),
    "algorithm": _choice(list(ALGORITHMS)),
    "burst": st.none() | limits,
    "action": _choice(ACTIONS),
    "fail_mode": _choice(FAIL_MODES),
    "enabled": st.booleans(),
}


@st.composite
def valid_rule_fields(draw: Any, actions: tuple[str, ...] = tuple(ACTIONS)) -> dict[str, Any]:
    """A rule the contract allows."""
    kind = draw(st.sampled_from(KEY_KINDS))
    algorithm = draw(st.sampled_from(ALGORITHMS))
    action = draw(st.sampled_from([a for a in actions if a != "delay" or "leaky" in algorithm]))
    key_args = {
        "header": st.text(TCHARS, min_size=1, max_size=20),
        "param": st.text(CHARS, max_size=20).map(str.strip).filter(bool),
        "custom": st.just("tenant"),
    }
    return {
        "scope": draw(
            st.one_of(
                st.sampled_from(["*", "/", "/api/", "plain", "shop:named", r"^/users/\d+/$"]),
                st.text(CHARS, max_size=20).map(lambda p: "/" + p),
            )
        ),
        "methods": draw(st.sampled_from(["", "GET", "POST,PROPFIND", "get, head"])),
        "key_kind": kind,
        "key_arg": draw(key_args[kind]) if kind in key_args else "",
        "limit": draw(st.integers(1, 50) | st.just(MAX_LIMIT)),
        "unit": draw(st.sampled_from(UNITS)),
        "algorithm": algorithm,
        "burst": draw(st.none() | st.integers(1, 50)) if "bucket" in algorithm else None,
        "action": action,
        "fail_mode": draw(st.sampled_from(FAIL_MODES)),
        "enabled": draw(st.booleans()),
    }


@st.composite
def rule_definitions(draw: Any) -> dict[str, Any]:
    """A valid rule with one to three fields replaced by anything, valid or not."""
    fields = draw(valid_rule_fields())
    for name in draw(st.sets(st.sampled_from(sorted(ANY_FIELD)), min_size=1, max_size=3)):
        fields[name] = draw(ANY_FIELD[name])
    return fields


_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")  # RFC 9110 token: a header name


def is_scope_name(scope: str) -> bool:
    """One word, and not '*' followed by more (a scope name, not the '*' of every request)."""
    return not scope.startswith("*") and not any(c.isspace() for c in scope)


# docs/bounds.md "What is refused": Python's syntax that RE2 cannot run, read off Python's own
# parse of the pattern. (A program over 8 MiB is not judged here: it takes RE2's compiler to
# know; tests/test_patterns_linear.py refuses one.)
MAX_RE2_REPEAT = 1000
_C = sre_constants
NEVER_IN_RE2 = {_C.ASSERT, _C.ASSERT_NOT, _C.GROUPREF, _C.GROUPREF_EXISTS} | {
    getattr(_C, name) for name in ("POSSESSIVE_REPEAT", "ATOMIC_GROUP") if hasattr(_C, name)
}


def re2_can_run(items: list[Any], flags: int, at_end: bool, repeats_left: int) -> bool:
    """``at_end``: nothing can follow the last of ``items``; ``repeats_left``: what the
    repeats around them leave of RE2's 1,000 (nested counts multiply)."""
    for index, (op, av) in enumerate(items):
        last = at_end and index == len(items) - 1
        if op in NEVER_IN_RE2:
            return False
        if op in (_C.MAX_REPEAT, _C.MIN_REPEAT):
            low, high, body = av
            count = low if high == _C.MAXREPEAT else high
            inner = repeats_left // count if count else repeats_left
            if count > MAX_RE2_REPEAT or not inner:
                return False
            if not re2_can_run(list(body), flags, last and high <= 1, inner):
                return False
        elif op == _C.SUBPATTERN:
            _group, add, remove, body = av
            if not re2_can_run(list(body), (flags | add) & ~remove, last, repeats_left):
                return False
        elif op == _C.BRANCH:
            if not all(re2_can_run(list(b), flags, last, repeats_left) for b in av[1]):
                return False
        elif op == _C.AT:
            if av == _C.AT_END and not last and not flags & re.MULTILINE:
                return False  # Python's $ also holds before a final newline
            if av in (_C.AT_BOUNDARY, _C.AT_NON_BOUNDARY) and not flags & re.ASCII:
                return False  # RE2's word characters are ASCII only
    return True


def contract_allows(fields: dict[str, Any]) -> bool:
    """The contract's rules for a Rule, written out independently of models.py."""
    scope = fields["scope"].strip()
    if len(fields["scope"]) > 255 or not scope:
        return False
    if scope.startswith("^"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # "Possible nested set": ambiguous, so bad
                re.compile(scope)
                parsed = sre_parse.parse(scope)
        except (re.error, Warning, OverflowError):
            return False
        flags = parsed.state.flags
        if not re2_can_run(list(parsed), flags, at_end=True, repeats_left=MAX_RE2_REPEAT):
            return False
    elif scope != "*" and not scope.startswith("/") and not is_scope_name(scope):
        return False

    # Comma-separated HTTP methods, in any case; this project spells them with letters only.
    if len(fields["methods"]) > 100:
        return False
    for method in fields["methods"].split(","):
        method = method.strip().upper()
        if method and not (method.isascii() and method.isalpha()):
            return False

    kind, arg = fields["key_kind"], fields["key_arg"].strip()
    if kind not in KEY_KINDS or len(fields["key_arg"]) > 100:
        return False
    if kind in ("header", "param", "custom"):
        if not arg:
            return False
        if kind == "header" and not _TOKEN.fullmatch(arg):
            return False
        if kind == "custom" and arg not in KEY_FUNCTIONS:
            return False
    elif arg:
        return False

    if not 1 <= fields["limit"] <= MAX_LIMIT:
        return False
    if fields["unit"] not in UNITS or fields["algorithm"] not in ALGORITHMS:
        return False
    burst = fields["burst"]
    if burst is not None and not (
        1 <= burst <= MAX_LIMIT and fields["algorithm"] in ("token_bucket", "leaky_bucket")
    ):
        return False
    if fields["action"] not in ACTIONS or fields["fail_mode"] not in FAIL_MODES:
        return False
    return fields["action"] != "delay" or fields["algorithm"] == "leaky_bucket"


def test_validation_accepts_exactly_the_rules_the_contract_allows() -> None:
    accepted = []

    @settings(FUZZ, max_examples=400)
    @given(rule_definitions())
    def one(fields: dict[str, Any]) -> None:
        try:
            Rule(name="fuzzed", **fields).full_clean()
        except ValidationError:
            valid = False
        else:
            valid = True
        assert valid == contract_allows(fields), fields
        accepted.append(valid)

    one()
    # Both answers were exercised, plenty of times.
    assert accepted.count(True) >= 20
    assert accepted.count(False) >= 20


@pytest.mark.usefixtures("throttle_middleware")
def test_fuzzed_valid_rules_never_break_a_request(client: Any, redis_client: Any) -> None:
    @settings(FUZZ, max_examples=40)
    @given(
        st.lists(valid_rule_fields(actions=("reject", "log")), min_size=1, max_size=3),
        st.lists(requests(), max_size=3),
    )
    def one(fields: list[dict[str, Any]], batch: list[dict[str, Any]]) -> None:
        Rule.objects.all().delete()
        for i, f in enumerate(fields):
            assert contract_allows(f)
            Rule.objects.create(name=f"r{i}", **{**f, "enabled": True})
        replace_runtime()  # the test's transaction never commits, so no refresh is announced
        for request in [*batch, {"method": "GET", "path": "/api/items/", "extra": {}}]:
            response = client.generic(request["method"], request["path"], **request["extra"])
            assert response.status_code < 500, (fields, request)

    one()
    assert_keys_expire_and_are_short(redis_client)


# -- the memory store stays bounded -------------------------------------------------------------


def test_memory_store_never_holds_more_than_max_keys() -> None:
    rules = [make_rule(a, 5, rule_id=i) for i, a in enumerate(ALGORITHMS, start=1)]

    @settings(FUZZ, max_examples=60)
    @given(
        st.integers(1, 40),
        st.lists(
            st.tuples(st.sampled_from(rules), st.text(CHARS, max_size=30), st.integers(1, 3)),
            min_size=1,
            max_size=200,
        ),
    )
    def one(max_keys: int, traffic: list[tuple[Any, str, int]]) -> None:
        store = MemoryStore(max_keys=max_keys)
        for i, (r, who, cost) in enumerate(traffic):
            # Many distinct identities: the loop index makes most of them new.
            store.decide([Check(r, f"{who}:{i % 97}", cost)])
            assert len(store) <= max_keys

    one()
