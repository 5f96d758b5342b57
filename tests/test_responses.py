"""Rate-limit headers, and the bodies of 429s: JSON or HTML by Accept, or a custom view."""

from __future__ import annotations

import random
import re
import sys
import time
from typing import Any

import django
import pytest

from tests.helpers import rule

pytestmark = pytest.mark.django_db

MW = pytest.mark.usefixtures("throttle_middleware")

RATE_HEADERS = ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset")
IETF_HEADERS = ("RateLimit-Policy", "RateLimit")


def ratelimit_item(response: Any) -> tuple[str, int, int]:
    """The name, r and t of the RateLimit field."""
    match = re.fullmatch(r'"([^"]*)";r=(\d+);t=(\d+)', response["RateLimit"])
    assert match, response["RateLimit"]
    return match[1], int(match[2]), int(match[3])


@pytest.fixture
def headers_off(settings: Any) -> None:
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "HEADERS": False}


# -- how the fields are written ------------------------------------------------------------


def _decision(rule_name: str) -> Any:
    from django_throttle.decision import Decision

    return Decision(True, 10, 7, 2_000_000_060.2, 0.0, rule_name, 60, decided_at=2_000_000_001.5)


class _OwnHeaders(django.http.response.ResponseHeaders):
    """Headers of a kind Django does not make: written through __setitem__ only."""

    written: list[str]

    def __setitem__(self, key: str, value: str) -> None:
        self.written.append(key)
        super().__setitem__(key, value)


@pytest.mark.parametrize(
    ("name", "quoted"),
    [
        ("plain", '"plain"'),
        ('a "quoted\\" rule', r'"a \"quoted\\\" rule"'),
        ("r\u00e9gle\nbr\u00fbl\u00e9e \u2603", '"r?gle?br?l?e ?"'),
    ],
)
def test_fields_written_into_djangos_header_store_read_as_set_by_name(
    name: str, quoted: str
) -> None:
    """add_headers() fills ResponseHeaders' dict directly; the response carries, sends and
    serializes exactly what setting each field by name gives, whatever the rule's name."""
    from django.http import HttpResponse

    from django_throttle.responses import (
        POLICY,
        RATELIMIT,
        X_LIMIT,
        X_REMAINING,
        X_RESET,
        _header_store,
        add_headers,
    )

    direct, by_name = HttpResponse("x"), HttpResponse("x")
    assert _header_store(direct) is not None  # Django's own kind: the direct way is taken
    add_headers(direct, _decision(name))
    expected = {
        X_LIMIT: "10",
        X_REMAINING: "7",
        X_RESET: "2000000061",
        POLICY: f"{quoted};q=10;w=60",
        RATELIMIT: f"{quoted};r=7;t=60",
    }
    for field, value in expected.items():
        by_name[field] = value
    assert dict(direct.items()) == dict(by_name.items())
    assert direct.serialize_headers() == by_name.serialize_headers()
    assert all(direct.has_header(field.upper()) for field in expected)


def test_headers_of_another_kind_get_the_fields_by_name() -> None:
    from django.http import HttpResponse

    from django_throttle.responses import add_missing_headers

    response = HttpResponse("x", status=429)
    response.headers = own = _OwnHeaders({})
    own.written = []
    add_missing_headers(response, _decision("plain"))
    assert own.written == [*RATE_HEADERS, *IETF_HEADERS, "Retry-After"]
    add_missing_headers(response, _decision("other"))  # found there: nothing written again
    assert own.written == [*RATE_HEADERS, *IETF_HEADERS, "Retry-After"]


def test_a_response_class_with_its_own_setitem_gets_the_fields_through_it() -> None:
    from django.http import HttpResponse

    from django_throttle.responses import add_headers, add_missing_headers

    class Recording(HttpResponse):
        def __setitem__(self, header: str, value: str) -> None:
            self.written.append(header)
            super().__setitem__(header, value)

    response = Recording("x")
    response.written = []
    add_headers(response, _decision("plain"))
    assert response.written == [*RATE_HEADERS, *IETF_HEADERS]
    add_missing_headers(response, _decision("other"))
    assert response.written == [*RATE_HEADERS, *IETF_HEADERS]


@pytest.mark.parametrize("status", [200, 429, 503])
def test_a_field_the_view_set_in_any_case_is_kept(status: int) -> None:
    from django.http import HttpResponse

    from django_throttle.responses import add_missing_headers

    response = HttpResponse("x", status=status)
    response["x-ratelimit-LIMIT"] = "3"
    add_missing_headers(response, _decision("plain"))
    assert response["X-RateLimit-Limit"] == "3"
    assert not response.has_header("X-RateLimit-Remaining")
    assert not response.has_header("Retry-After")


@pytest.mark.parametrize(("status", "retry_after"), [(200, None), (429, "5"), (503, "7")])
def test_missing_fields_are_added_and_a_retry_after_of_the_view_kept(
    status: int, retry_after: str | None
) -> None:
    """Retry-After goes on a 429 or 503 without one (the decision's wait, at least 1 s)."""
    from django.http import HttpResponse

    from django_throttle.responses import add_missing_headers

    fresh, own = HttpResponse("x", status=status), HttpResponse("x", status=status)
    if retry_after is not None:
        own["retry-after"] = retry_after
    for response in (fresh, own):
        add_missing_headers(response, _decision("plain"))
        assert all(response.has_header(field) for field in (*RATE_HEADERS, *IETF_HEADERS))
    assert fresh.get("Retry-After") == (None if status == 200 else "1")
    assert own.get("Retry-After") == retry_after


# -- headers on admitted responses --------------------------------------------------------


@MW
def test_admitted_response_headers(client: Any) -> None:
    rule("plain page", "plain", 5, algorithm="token_bucket", unit="hour")
    before = time.time()
    response = client.get("/plain/")
    assert response.status_code == 200
    assert response["X-RateLimit-Limit"] == "5"
    assert response["X-RateLimit-Remaining"] == "4"
    reset_at = int(response["X-RateLimit-Reset"])
    assert before < reset_at <= time.time() + 3600 + 1
    assert response["RateLimit-Policy"] == '"plain page";q=5;w=3600'
    name, remaining, seconds = ratelimit_item(response)
    assert name == "plain page"
    assert remaining == int(response["X-RateLimit-Remaining"])
    assert abs(seconds - (reset_at - time.time())) <= 2
    assert "Retry-After" not in response


def test_decorator_alone_sets_headers(client: Any) -> None:
    response = client.get("/search/")  # code default 3/m
    assert response["X-RateLimit-Limit"] == "3"
    assert response["X-RateLimit-Remaining"] == "2"
    assert response["RateLimit-Policy"] == '"search";q=3;w=60'
    assert ratelimit_item(response)[:2] == ("search", 2)


@MW
def test_headers_show_the_rule_with_fewest_remaining(client: Any) -> None:
    rule("everything", "*", 10, algorithm="token_bucket", unit="hour")
    rule("api", "/api/", 3, algorithm="token_bucket", unit="hour")
    response = client.get("/api/items/")
    assert ratelimit_item(response)[:2] == ("api", 2)
    assert response["X-RateLimit-Limit"] == "3"
    assert response["RateLimit-Policy"] == '"api";q=3;w=3600'
    # Where only '*' applies, it is shown.
    assert ratelimit_item(client.get("/plain/"))[:2] == ("everything", 8)


@MW
@pytest.mark.parametrize("hourly_scope", ["*", "/api/"])
def test_headers_tie_goes_to_the_later_reset(client: Any, hourly_scope: str) -> None:
    # Both have 4 left after one request; the hourly bucket refills later.
    minutely_scope = "/api/" if hourly_scope == "*" else "*"
    rule("per hour", hourly_scope, 5, algorithm="token_bucket", unit="hour")
    rule("per minute", minutely_scope, 5, algorithm="token_bucket", unit="minute")
    response = client.get("/api/items/")
    assert ratelimit_item(response)[:2] == ("per hour", 4)
    assert response["RateLimit-Policy"] == '"per hour";q=5;w=3600'


# -- headers on rejected responses ----------------------------------------------------------


@MW
def test_rejected_response_headers(client: Any) -> None:
    rule("api", "/api/", 1)
    client.get("/api/items/")
    response = client.get("/api/items/")
    assert response.status_code == 429
    assert re.fullmatch(r"\d+", response["Retry-After"])
    assert int(response["Retry-After"]) >= 1
    assert response["X-RateLimit-Limit"] == "1"
    assert response["X-RateLimit-Remaining"] == "0"
    assert int(response["X-RateLimit-Reset"]) > time.time() - 1
    assert response["RateLimit-Policy"] == '"api";q=1;w=60'
    assert ratelimit_item(response)[:2] == ("api", 0)


@MW
@pytest.mark.usefixtures("headers_off")
def test_headers_false_keeps_them_on_429s_only(client: Any) -> None:
    rule("api", "/api/", 1)
    admitted = client.get("/api/items/")
    assert admitted.status_code == 200
    for header in RATE_HEADERS + IETF_HEADERS:
        assert header not in admitted
    refused = client.get("/api/items/")
    assert refused.status_code == 429
    for header in (*RATE_HEADERS, *IETF_HEADERS, "Retry-After"):
        assert header in refused


@pytest.mark.usefixtures("headers_off")
def test_headers_false_with_the_decorator_alone(client: Any) -> None:
    responses = [client.get("/search/") for _ in range(4)]
    for admitted in responses[:3]:
        assert "X-RateLimit-Limit" not in admitted
        assert "RateLimit" not in admitted
    assert responses[3].status_code == 429
    assert responses[3]["X-RateLimit-Limit"] == "3"
    assert int(responses[3]["Retry-After"]) >= 1


# -- bodies -------------------------------------------------------------------------------


def refused(client: Any, **extra: Any) -> Any:
    """A 429 from the code default of /search/ (3/m)."""
    for _ in range(3):
        assert client.get("/search/").status_code == 200
    response = client.get("/search/", **extra)
    assert response.status_code == 429
    return response


@pytest.mark.parametrize(
    "accept", ["application/json", "text/html;q=0.5, application/json", "application/*"]
)
def test_json_body_when_json_is_preferred(client: Any, accept: str) -> None:
    response = refused(client, HTTP_ACCEPT=accept)
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"detail", "retry_after"}
    assert body["retry_after"] == int(response["Retry-After"]) >= 1
    assert isinstance(body["detail"], str) and body["detail"]


@pytest.mark.parametrize(
    "accept", ["text/html", "*/*", None, "application/json;q=0.5, text/html", "text/*"]
)
def test_html_body_otherwise(client: Any, accept: str | None) -> None:
    extra = {} if accept is None else {"HTTP_ACCEPT": accept}
    response = refused(client, **extra)
    assert response["Content-Type"].startswith("text/html")
    text = response.content.decode()
    assert "<html" in text
    seconds = int(response["Retry-After"])
    assert re.search(rf"try again in {seconds} seconds?\.", text)


@MW
def test_rejection_view_setting(client: Any, settings: Any) -> None:
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "REJECTION_VIEW": "tests.views.custom_rejection",
    }
    rule("api", "/api/", 1)
    client.get("/api/items/")
    response = client.get("/api/items/", HTTP_ACCEPT="application/json")
    assert response.status_code == 429
    assert response.content == b"slow down (api)"
    assert int(response["Retry-After"]) >= 1
    assert response["X-RateLimit-Remaining"] == "0"


@MW
def test_rejections_are_not_logged_by_djangos_request_logger(client: Any, caplog: Any) -> None:
    # A flood of 429s must not become a flood of warnings (or of ERROR mails for 503s).
    rule("plain page", "plain", 1, unit="hour")
    with caplog.at_level("WARNING", logger="django.request"):
        assert [client.get("/plain/").status_code for _ in range(3)] == [200, 429, 429]
        assert client.get("/missing-page/").status_code == 404
    logged = [r.getMessage() for r in caplog.records if r.name == "django.request"]
    assert logged == ["Not Found: /missing-page/"]


# -- Accept read within bounds ------------------------------------------------------------


class MediaRangesParsed:
    """Counts the media ranges of Accept parsed while it is active (by django_throttle, or by
    Django's MediaType)."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> MediaRangesParsed:
        from django.http.request import MediaType

        from django_throttle.responses import media_range

        codes = {MediaType.__init__.__code__, media_range.__code__}

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and frame.f_code in codes:
                self.count += 1

        sys.setprofile(profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


NOISE = "text/x-a;q=0.1"  # a range that is neither HTML nor JSON


def test_media_ranges_past_the_32nd_are_not_read(client: Any) -> None:
    flood = ", ".join([NOISE] * 100_000) + ", application/json"
    with MediaRangesParsed() as parsed:
        response = refused(client, HTTP_ACCEPT=flood)
    assert response["Content-Type"].startswith("text/html")  # the JSON range was never read
    assert parsed.count <= 32


def test_the_32nd_media_range_is_read(client: Any) -> None:
    response = refused(client, HTTP_ACCEPT=", ".join([NOISE] * 31 + ["application/json"]))
    assert response["Content-Type"] == "application/json"


LONG = "text/x-a;p=" + "x" * 8192 + ", application/json"  # JSON after 8 KB
WITHIN = "text/x-a;p=" + "x" * 3000 + ", application/json"  # JSON within the first 4 KB


@pytest.mark.parametrize(("accept", "body"), [(LONG, "text/html"), (WITHIN, "application/json")])
def test_accept_past_its_first_4_kb_is_not_read(client: Any, accept: str, body: str) -> None:
    with MediaRangesParsed() as parsed:
        response = refused(client, HTTP_ACCEPT=accept)
    assert response["Content-Type"].startswith(body)
    assert parsed.count <= 2


def test_a_media_range_django_cannot_parse_is_skipped(client: Any) -> None:
    # An RFC 2231 parameter with an unknown charset: Django's parser raises ValueError.
    response = refused(client, HTTP_ACCEPT="text/html;a*=bogus''x;q=0.9, application/json")
    assert response.status_code == 429
    assert response["Content-Type"] == "application/json"


def django_body_type(accept: str) -> str:
    """What Django's own negotiation (HttpRequest.get_preferred_type) chooses."""
    from django.http import HttpRequest

    from django_throttle.responses import HTML, JSON, PROBLEM

    request = HttpRequest()
    request.META = {"HTTP_ACCEPT": accept}
    preferred = request.get_preferred_type([HTML, JSON])
    problem = request.accepted_type(PROBLEM)
    if problem is not None and problem.specificity >= 2:
        other = request.accepted_type(preferred) if preferred is not None else None
        if other is None or problem.quality >= other.quality:
            return PROBLEM
    return JSON if preferred == JSON else HTML


TYPES = [
    "text/html",
    "application/json",
    "application/problem+json",
    "*/*",
    "text/*",
    "application/*",
    "image/png",
    "*/json",
    "text",
    "",
    "TEXT/HTML",
]
MALFORMED = ["text", ""]  # ranges without a type and a subtype
PARAMS = ["", ";q=0", ";q=0.5", ";q=1", ";q=0.9", ";q=x", ";q=2", ';q="0.3"', ";level=1", ";q"]


@pytest.mark.skipif(
    django.VERSION < (5, 2, 4),
    reason="the reference is Django's negotiation as of 5.2.4: earlier 5.2 releases weigh "
    "media-type parameters otherwise (Django #36411, #36447)",
)
def test_the_body_chosen_is_django_s_choice() -> None:
    from django.test import RequestFactory

    from django_throttle.responses import body_type

    rng = random.Random(30)
    factory = RequestFactory()
    for _ in range(3000):
        ranges = [
            rng.choice(TYPES) + rng.choice(PARAMS) + rng.choice(["", ";level=2"] + [""] * 4)
            for _ in range(rng.randint(1, 6))
        ]
        accept = rng.choice([",", ", "]).join(ranges)
        request = factory.get("/", HTTP_ACCEPT=accept)
        assert body_type(request) == django_body_type(accept), accept


@pytest.mark.parametrize("malformed", MALFORMED)
def test_a_range_without_a_subtype_matches_nothing(malformed: str) -> None:
    from django.test import RequestFactory

    from django_throttle.responses import body_type

    factory = RequestFactory()
    for accept, chosen in (
        (f"application/json;q=0.5,{malformed};q=0.9", "application/json"),
        (f"text/html;q=0.1,{malformed};q=1,application/json;q=0.5", "application/json"),
        (f"{malformed}", "text/html"),  # nothing acceptable: the default form
    ):
        assert body_type(factory.get("/", HTTP_ACCEPT=accept)) == chosen, accept
