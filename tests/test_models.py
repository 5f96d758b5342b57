"""The Rule model: every bad input is refused on the right field, with a clear message."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings

from django_throttle.models import Rule
from django_throttle.rates import Rate, parse_rate

pytestmark = [pytest.mark.db_matters, pytest.mark.django_db]

ALGORITHMS = [
    "token_bucket",
    "leaky_bucket",
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
]
KEYS = [
    ("ip", ""),
    ("user", ""),
    ("user_or_ip", ""),
    ("header", "X-Api-Key"),
    ("param", "api_key"),
    ("global", ""),
    ("custom", "tenant"),
]


def make_rule(**fields: Any) -> Rule:
    values: dict[str, Any] = {
        "name": "login",
        "scope": "login",
        "key_kind": "ip",
        "limit": 5,
        "unit": "minute",
        "algorithm": "sliding_window_log",
    }
    values.update(fields)
    return Rule(**values)


def field_errors(rule: Rule) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as info:
        rule.full_clean()
    return info.value.message_dict


def assert_refused(rule: Rule, field: str, fragment: str) -> None:
    """full_clean() names the field with the message, and save() refuses and writes nothing."""
    before = Rule.objects.count()
    errors = field_errors(rule)
    assert field in errors, errors
    assert any(fragment in message for message in errors[field]), errors[field]
    with pytest.raises(ValidationError) as info:
        rule.save()
    assert field in info.value.message_dict
    assert Rule.objects.count() == before


# -- scope ---------------------------------------------------------------------


def test_bad_regex_scope_is_refused_with_the_regex_error():
    rule = make_rule(scope="^(unclosed")
    assert_refused(rule, "scope", "Invalid regular expression")
    assert any("missing )" in message for message in field_errors(rule)["scope"])


def test_empty_scope_is_refused():
    assert_refused(make_rule(scope=""), "scope", "Enter a scope: '*', a path prefix")


def test_blank_scope_is_refused_with_how_to_write_one():
    assert_refused(make_rule(scope="   "), "scope", "Enter a scope: '*', a path prefix")


def test_scope_name_with_spaces_is_refused():
    assert_refused(make_rule(scope="log in"), "scope", "A scope name cannot contain spaces.")


def test_scope_name_starting_with_a_star_is_refused_saying_why():
    assert_refused(make_rule(scope="*login"), "scope", "a scope name cannot start with '*'")


@pytest.mark.parametrize(
    "scope", ["*", "/api/", "/", r"^/users/\d+/$", "login", "accounts:login", "search-v2"]
)
def test_every_scope_form_is_accepted(scope):
    rule = make_rule(scope=scope)
    rule.save()
    assert Rule.objects.get().scope == scope


def test_scope_is_stripped_of_surrounding_spaces():
    rule = make_rule(scope="  /api/ ")
    rule.save()
    assert Rule.objects.get().scope == "/api/"


# -- key -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "fragment"),
    [
        ("header", "Name the header to key on"),
        ("param", "Name the query or form parameter to key on"),
        ("custom", "Name the key function to use"),
    ],
)
def test_kinds_with_an_argument_refuse_an_empty_key_arg(kind, fragment):
    assert_refused(make_rule(key_kind=kind, key_arg=""), "key_arg", fragment)


def test_whitespace_key_arg_counts_as_empty():
    assert_refused(make_rule(key_kind="header", key_arg="  "), "key_arg", "Name the header")


@pytest.mark.parametrize("kind", ["ip", "user", "user_or_ip", "global"])
def test_kinds_without_an_argument_refuse_a_key_arg(kind):
    assert_refused(
        make_rule(key_kind=kind, key_arg="X-Api-Key"),
        "key_arg",
        "Only header, param and custom keys take an argument",
    )


@pytest.mark.parametrize("header", ["X Api Key", "X-Api-Key:", "Ünicode", "a(b)"])
def test_invalid_header_name_is_refused(header):
    assert_refused(
        make_rule(key_kind="header", key_arg=header), "key_arg", "is not a valid header name"
    )


def test_unknown_custom_key_function_is_refused_naming_the_registered_ones():
    rule = make_rule(key_kind="custom", key_arg="account")
    assert_refused(rule, "key_arg", "No key function named 'account'")
    assert any("registered: tenant" in m for m in field_errors(rule)["key_arg"])


def test_custom_key_function_is_looked_up_in_the_current_settings():
    with override_settings(DJANGO_THROTTLE={"KEY_FUNCTIONS": {"account": "tests.keys.tenant"}}):
        make_rule(key_kind="custom", key_arg="account").save()
        assert_refused(
            make_rule(name="other", key_kind="custom", key_arg="tenant"),
            "key_arg",
            "No key function named 'tenant'",
        )
    assert Rule.objects.get().key_arg == "account"


def test_custom_key_function_is_refused_when_none_are_registered():
    with override_settings(DJANGO_THROTTLE={}):
        rule = make_rule(key_kind="custom", key_arg="tenant")
        assert_refused(rule, "key_arg", "No key function named 'tenant'")
        assert any("(none is registered)" in m for m in field_errors(rule)["key_arg"])


# -- limit and burst -------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, -1, -100])
def test_zero_or_negative_limit_is_refused(limit):
    assert_refused(make_rule(limit=limit), "limit", "The limit must allow at least 1 request.")


def test_huge_limit_is_refused():
    assert_refused(make_rule(limit=10**10), "limit", "The limit can be at most 1000000000.")


@pytest.mark.parametrize(
    "algorithm", ["fixed_window", "sliding_window_log", "sliding_window_counter"]
)
def test_burst_is_refused_on_algorithms_without_one(algorithm):
    assert_refused(
        make_rule(algorithm=algorithm, burst=10),
        "burst",
        "Only token bucket and leaky bucket have a burst",
    )


@pytest.mark.parametrize("algorithm", ["token_bucket", "leaky_bucket"])
def test_burst_is_accepted_on_buckets(algorithm):
    make_rule(algorithm=algorithm, burst=20).save()
    assert Rule.objects.get().burst == 20


def test_burst_below_one_is_refused():
    assert_refused(
        make_rule(algorithm="token_bucket", burst=0), "burst", "The burst must be at least 1."
    )


# -- behaviour ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "algorithm", ["token_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter"]
)
def test_delay_is_refused_except_on_leaky_bucket(algorithm):
    assert_refused(
        make_rule(algorithm=algorithm, action="delay"),
        "action",
        "Delay works with the leaky bucket algorithm only.",
    )


def test_delay_is_accepted_on_leaky_bucket():
    make_rule(algorithm="leaky_bucket", action="delay").save()
    assert Rule.objects.get().action == "delay"


@pytest.mark.parametrize("methods", ["GET POST", "G3T", "POST;PUT", "get,p*st"])
def test_bad_method_token_is_refused(methods):
    assert_refused(make_rule(methods=methods), "methods", "is not an HTTP method")


@pytest.mark.parametrize(
    ("given", "stored"),
    [("post, put", "POST,PUT"), (" get ", "GET"), ("POST,,PUT,", "POST,PUT"), ("", "")],
)
def test_methods_are_normalized(given, stored):
    make_rule(methods=given).save()
    assert Rule.objects.get().methods == stored


def test_several_problems_are_reported_together():
    errors = field_errors(
        make_rule(scope="^(", limit=0, key_kind="header", key_arg="", burst=3, action="delay")
    )
    assert {"scope", "limit", "key_arg", "burst", "action"} <= set(errors)


# -- valid rules ----------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("kind", "arg"), KEYS)
def test_valid_rules_of_every_algorithm_and_key_kind_save(algorithm, kind, arg):
    rule = make_rule(name=f"{algorithm}-{kind}", algorithm=algorithm, key_kind=kind, key_arg=arg)
    rule.save()
    stored = Rule.objects.get()
    assert (stored.algorithm, stored.key_kind, stored.key_arg) == (algorithm, kind, arg)
    assert stored.enabled is True
    assert stored.action == "reject"
    assert stored.fail_mode == "default"


def test_duplicate_name_is_refused():
    make_rule().save()
    duplicate = make_rule(scope="/other/")
    assert "already exists" in field_errors(duplicate)["name"][0]
    with pytest.raises(ValidationError):
        duplicate.save()
    assert Rule.objects.count() == 1


# -- __str__ --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({}, "login: 5 per minute per ip, sliding window log"),
        (
            {"name": "api", "limit": 5, "unit": "second", "algorithm": "token_bucket", "burst": 20},
            "api: 5 per second per ip, token bucket, burst 20",
        ),
        (
            {"name": "keys", "key_kind": "header", "key_arg": "X-Api-Key", "unit": "hour"},
            "keys: 5 per hour per header X-Api-Key, sliding window log",
        ),
        (
            {"name": "all", "key_kind": "global", "limit": 1000, "algorithm": "fixed_window"},
            "all: 1000 per minute shared by all, fixed window",
        ),
        (
            {"name": "search", "key_kind": "user_or_ip", "enabled": False},
            "search: 5 per minute per user or ip, sliding window log (disabled)",
        ),
        (
            {"name": "shadow", "action": "log", "algorithm": "sliding_window_counter"},
            "shadow: 5 per minute per ip, sliding window counter, log",
        ),
        (
            {"name": "t", "key_kind": "custom", "key_arg": "tenant", "unit": "day"},
            "t: 5 per day per custom tenant, sliding window log",
        ),
    ],
)
def test_str_reads_like_the_rule(fields, text):
    rule = make_rule(**fields)
    rule.save()
    assert str(rule) == text


# -- rates ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rate", "period"),
    [
        ("30/m", Rate(30, "minute"), 60),
        ("5/s", Rate(5, "second"), 1),
        ("100/hour", Rate(100, "hour"), 3600),
        ("1/d", Rate(1, "day"), 86400),
        (" 7 / MIN ", Rate(7, "minute"), 60),
    ],
)
def test_parse_rate(text, rate, period):
    parsed = parse_rate(text)
    assert parsed == rate
    assert parsed.period == period
    assert str(parsed) == f"{rate.limit}/{rate.unit}"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("30", "must look like '30/m'"),
        ("", "must look like '30/m'"),
        ("x/m", "must start with a whole number"),
        ("1.5/m", "must start with a whole number"),
        ("0/m", "must allow at least one request"),
        ("-3/s", "must allow at least one request"),
        ("30/y", "unknown unit 'y'"),
        ("30/", "unknown unit"),
    ],
)
def test_parse_rate_errors(text, fragment):
    with pytest.raises(ValueError) as info:
        parse_rate(text)
    assert fragment in str(info.value)


def test_a_window_longer_than_ten_years_is_refused():
    from django.core.exceptions import ValidationError

    from django_throttle.rates import parse_rate

    with pytest.raises(ValidationError) as refused:
        Rule(name="r", scope="/x/", limit=5, per=20_000, unit="day").full_clean()
    assert "per" in refused.value.message_dict
    with pytest.raises(ValueError, match="a window lasts"):
        parse_rate("5/20000d")
