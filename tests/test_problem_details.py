"""The 429 (and the 503 of a fail-closed rule) as an RFC 9457 problem for a client whose Accept
prefers application/problem+json, through the middleware and the decorator; JSON and HTML
clients keep their bodies, and the rate-limit headers are the same whatever the body."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.helpers import rule, run
from tests.redis_server import RedisServer

pytestmark = pytest.mark.django_db

MW = pytest.mark.usefixtures("throttle_middleware")

PROBLEM = "application/problem+json"
QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
QUOTA_TITLE = "Request cannot be satisfied as assigned quota has been exceeded"
RATE_HEADERS = (
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "RateLimit-Policy",
)


def refused(client: Any, path: str, times: int, **extra: Any) -> Any:
    """The response to the request after ``times`` admitted ones."""
    for _ in range(times):
        assert client.get(path).status_code == 200
    response = client.get(path, **extra)
    assert response.status_code == 429
    return response


def assert_quota_problem(response: Any, policies: list[str]) -> dict[str, Any]:
    assert response.status_code == 429
    assert response["Content-Type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert list(body) == [
        "type",
        "title",
        "status",
        "detail",
        "violated-policies",
        "retry_after",
    ]
    assert body["type"] == QUOTA_EXCEEDED
    assert body["title"] == QUOTA_TITLE
    assert body["status"] == 429
    assert body["retry_after"] == int(response["Retry-After"]) >= 1
    assert re.fullmatch(r"Too many requests\. Please try again in \d+ seconds\.", body["detail"])
    assert str(body["retry_after"]) in body["detail"]
    assert sorted(body["violated-policies"]) == sorted(policies)  # in the rules' order
    return body


# -- the problem, through the middleware and the decorator -------------------------------------


@MW
def test_middleware_answers_a_problem_with_the_usual_headers(client: Any) -> None:
    rule("api", "/api/", 1, unit="hour")
    response = refused(client, "/api/items/", 1, HTTP_ACCEPT=PROBLEM)
    assert_quota_problem(response, ["api"])
    # The headers are those of the same 429 as HTML.
    as_html = client.get("/api/items/", HTTP_ACCEPT="text/html")
    assert as_html["Content-Type"].startswith("text/html")
    for header in RATE_HEADERS:
        assert response[header] == as_html[header]
    assert response["RateLimit-Policy"] == '"api";q=1;w=3600'
    assert re.fullmatch(r'"api";r=0;t=\d+', response["RateLimit"])
    assert re.fullmatch(r"\d+", response["X-RateLimit-Reset"])


def test_decorator_answers_a_problem(client: Any) -> None:
    response = refused(client, "/search/", 3, HTTP_ACCEPT=PROBLEM)  # @throttle rate="3/m"
    assert_quota_problem(response, ["search"])
    assert response["RateLimit-Policy"] == '"search";q=3;w=60'
    assert response["X-RateLimit-Remaining"] == "0"


@MW
def test_async_requests_get_the_problem_too(async_client: Any) -> None:
    rule("api", "/async/", 1)

    async def body() -> list[Any]:
        return [await async_client.get("/async/", headers={"accept": PROBLEM}) for _ in range(2)]

    admitted, response = run(body)
    assert admitted.status_code == 200
    assert_quota_problem(response, ["api"])


@MW
def test_violated_policies_name_every_enforcing_rule_that_rejected(client: Any) -> None:
    rule("per minute", "/api/", 1, algorithm="sliding_window_log")
    rule("per hour", "/api/", 1, algorithm="sliding_window_log", unit="hour")
    rule("roomy", "/api/", 100, algorithm="sliding_window_log")
    rule("trial", "/api/", 1, algorithm="sliding_window_log", action="log")  # log-only
    response = refused(client, "/api/items/", 1, HTTP_ACCEPT=PROBLEM)
    body = assert_quota_problem(response, ["per minute", "per hour"])
    # The deciding rule (the longest wait) is the one the headers describe.
    assert response["RateLimit-Policy"] == '"per hour";q=1;w=3600'
    assert "roomy" not in body["violated-policies"]


# -- Accept negotiation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (PROBLEM, "problem"),
        ("application/problem+json, application/json", "problem"),
        ("application/json, application/problem+json", "problem"),  # a tie: named, understood
        ("text/html, application/problem+json", "problem"),
        ("application/problem+json;q=0.9, text/html;q=0.5", "problem"),
        ("application/problem+json;q=0.5, text/html;q=1", "html"),
        ("application/problem+json;q=0.5, text/html", "html"),
        ("application/problem+json;q=0.5, application/json", "json"),
        ("application/problem+json;q=0, */*", "html"),
        ("application/problem+json;q=0, application/json", "json"),
        ("application/json", "json"),
        ("application/*", "json"),
        ("*/*", "html"),
        ("text/html", "html"),
        (None, "html"),
        ("", "html"),
        ("not a media type;;q=x, ,", "html"),
    ],
)
def test_accept_chooses_the_body(client: Any, accept: str | None, expected: str) -> None:
    extra = {} if accept is None else {"HTTP_ACCEPT": accept}
    response = refused(client, "/search/", 3, **extra)
    content_type = response["Content-Type"]
    if expected == "problem":
        assert_quota_problem(response, ["search"])
    elif expected == "json":
        # Today's JSON body, exactly.
        assert content_type == "application/json"
        body = response.json()
        assert list(body) == ["detail", "retry_after"]
        assert body["retry_after"] == int(response["Retry-After"])
    else:
        assert content_type.startswith("text/html")
        assert "<html" in response.content.decode()


@MW
def test_a_rejection_view_is_used_whatever_the_accept(client: Any, settings: Any) -> None:
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "REJECTION_VIEW": "tests.views.custom_rejection",
    }
    rule("api", "/api/", 1)
    response = refused(client, "/api/items/", 1, HTTP_ACCEPT=PROBLEM)
    assert response.content == b"slow down (api)"


# -- the 503 of a fail-closed rule -------------------------------------------------------------


@MW
def test_a_fail_closed_rule_with_the_store_down_answers_a_503_problem(
    client: Any, settings: Any, redis_server: RedisServer
) -> None:
    if not redis_server.managed:
        pytest.skip("an outage is done to a redis-server the harness runs; unset REDIS_URL")
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "TIMEOUT": 0.2,
        "CONNECT_TIMEOUT": 0.2,
        "BREAKER_INTERVAL": 30,
    }
    rule("closed", r"^/users/\d+/$", 5, fail_mode="closed")
    assert client.get("/users/1/").status_code == 200
    redis_server.kill()
    try:
        response = client.get("/users/1/", HTTP_ACCEPT=PROBLEM)
        as_json = client.get("/users/1/", HTTP_ACCEPT="application/json")
    finally:
        redis_server.start()
    assert response.status_code == 503
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    assert body == {
        "type": "about:blank",
        "title": "Service Unavailable",
        "status": 503,
        "detail": "The service is temporarily unavailable. Please try again later.",
        "retry_after": int(response["Retry-After"]),
    }
    assert as_json.status_code == 503
    assert as_json["Content-Type"] == "application/json"
    assert list(as_json.json()) == ["detail", "retry_after"]
