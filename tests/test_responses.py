"""Rate-limit headers, and the bodies of 429s: JSON or HTML by Accept, or a custom view."""

from __future__ import annotations

import re
import time
from typing import Any

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
