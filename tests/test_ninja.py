"""django-ninja: RuleThrottle at API, router and operation level, sync and async, through the
engine; document_limits() in the API's schema."""

from __future__ import annotations

import json
import subprocess
import sys
from http.client import HTTPConnection
from typing import Any

import pytest

from django_throttle.models import Override
from django_throttle.signals import request_throttled
from tests.helpers import rule, run
from tests.redis_server import RedisServer
from tests.served import ROOT, serving

ninja = pytest.importorskip("ninja")
from ninja.testing import TestAsyncClient, TestClient  # noqa: E402

from tests.ninja_api import api  # noqa: E402

pytestmark = pytest.mark.django_db

PROBLEM = "application/problem+json"


def codes(client: Any, path: str, times: int, **extra: Any) -> list[int]:
    return [client.get(path, **extra).status_code for _ in range(times)]


def meta(accept: str | None = None, address: str = "127.0.0.1") -> dict[str, Any]:
    """TestClient's request META (its ``headers=`` keeps the header's case, which Django's
    META never has)."""
    found = {"REMOTE_ADDR": address}
    if accept is not None:
        found["HTTP_ACCEPT"] = accept
    return {"META": found}


# -- ninja's own TestClient (no middleware) ---------------------------------------------------


def test_api_router_and_operation_throttles_each_decide_their_scope() -> None:
    rule("api-level", "ninja-api", 2, algorithm="fixed_window")
    rule("router-level", "ninja-router", 1, algorithm="fixed_window")
    rule("operation-level", "ninja-orders", 3, algorithm="fixed_window")
    client = TestClient(api)
    assert codes(client, "/items", 3) == [200, 200, 429]
    assert codes(client, "/r/reports", 2) == [200, 429]
    assert codes(client, "/orders", 4) == [200, 200, 200, 429]  # its own, not the API's
    assert codes(client, "/free", 5) == [200] * 5


def test_a_rejection_answers_as_everywhere_else() -> None:
    rule("api-level", "ninja-api", 1, algorithm="fixed_window")
    client = TestClient(api)
    admitted = client.get("/items")
    assert admitted.status_code == 200
    assert admitted["RateLimit-Policy"] == '"api-level";q=1;w=60'
    assert admitted["X-RateLimit-Remaining"] == "0"
    problem = client.get("/items", **meta(PROBLEM))
    assert problem.status_code == 429
    assert problem["Content-Type"] == PROBLEM
    body = problem.json()
    assert body["violated-policies"] == ["api-level"]
    assert 1 <= int(problem["Retry-After"]) <= 60
    assert problem["RateLimit"].startswith('"api-level";r=0;t=')
    as_json = client.get("/items", **meta("application/json"))
    assert set(as_json.json()) == {"detail", "retry_after"}


@pytest.mark.django_db(transaction=True)  # decided in a thread: the rules must be committed
def test_async_operations_are_decided_too() -> None:
    rule("api-level", "ninja-api", 2, algorithm="fixed_window")
    rule("router-level", "ninja-router", 1, algorithm="fixed_window")
    client = TestAsyncClient(api)

    async def body() -> list[int]:
        paths = ["/async-items"] * 3 + ["/r/async-reports"] * 2
        return [(await client.get(path)).status_code for path in paths]

    assert run(body) == [200, 200, 429, 200, 429]


def test_overrides_and_exemptions(django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        level = rule("api-level", "ninja-api", 1, algorithm="fixed_window")
        Override.objects.create(rule=level, key="ip:127.0.0.1", limit=3)
        Override.objects.create(rule=level, key="ip:198.51.100.9", exempt=True)
    client = TestClient(api)
    assert codes(client, "/items", 4) == [200, 200, 200, 429]  # the client's own limit
    exempt = [client.get("/items", **meta(address="198.51.100.9")) for _ in range(5)]
    assert [response.status_code for response in exempt] == [200] * 5


def test_a_rejection_is_announced_and_remembered(store_calls: Any) -> None:
    rule("api-level", "ninja-api", 1, algorithm="fixed_window", block_seconds=60)
    sent: list[tuple[str, bool]] = []

    def receiver(sender: Any, rule: str, shadow: bool, **kwargs: Any) -> None:
        sent.append((rule, shadow))

    request_throttled.connect(receiver)
    try:
        client = TestClient(api)
        assert codes(client, "/items", 2) == [200, 429]
        store_calls.decisions = 0
        assert codes(client, "/items", 3) == [429] * 3
    finally:
        request_throttled.disconnect(receiver)
    # The rejection log, the metrics and the signal hear of each rejection; the block cache
    # answers the later ones without the store.
    assert sent == [("api-level", False)] * 4
    assert store_calls.decisions == 0


def test_all_rules_of_a_request_in_one_store_call(store_calls: Any) -> None:
    for n in range(3):
        rule(f"api-{n}", "ninja-api", 5 + n)
    client = TestClient(api)
    client.get("/items")  # rules loaded, connection made
    store_calls.decisions = 0
    response = client.get("/items")
    assert response.status_code == 200
    assert store_calls.decisions == 1
    assert response["X-RateLimit-Remaining"] == "3"  # the most constrained: 5, twice spent


def test_a_fail_closed_rule_answers_503_while_the_store_is_down(
    settings: Any, redis_server: RedisServer
) -> None:
    if not redis_server.managed:
        pytest.skip("needs a redis-server the harness runs; unset REDIS_URL")
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "TIMEOUT": 0.5}
    rule("api-level", "ninja-api", 5, fail_mode="closed")
    client = TestClient(api)
    assert client.get("/items").status_code == 200
    redis_server.kill()
    try:
        response = client.get("/items", **meta(PROBLEM))
    finally:
        redis_server.start()
    assert response.status_code == 503
    assert response.json()["type"] == "about:blank"
    assert int(response["Retry-After"]) >= 1


# -- Django's test client: the whole stack, ThrottleMiddleware included -------------------------


@pytest.mark.usefixtures("throttle_middleware")
def test_counted_once_beside_the_middleware(client: Any, store_calls: Any) -> None:
    rule("ninja-paths", "/ninja/", 3, algorithm="fixed_window")
    remaining = []
    for n in range(4):
        response = client.get("/ninja/paths")
        remaining.append((response.status_code, response.get("X-RateLimit-Remaining")))
        if n == 0:
            store_calls.decisions = 0  # the rules loaded, the connection made
    assert remaining == [(200, "2"), (200, "1"), (200, "0"), (429, "0")]
    # One call a request, the middleware's: the throttle found its rules had counted it.
    assert store_calls.decisions == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("throttle_middleware")
def test_async_operations_under_the_middleware(async_client: Any) -> None:
    rule("ninja-paths", "/ninja/", 2, algorithm="fixed_window")
    rule("api-level", "ninja-api", 5, algorithm="fixed_window")

    async def body() -> list[tuple[int, str | None]]:
        seen = []
        for path in ["/ninja/async-paths"] * 3 + ["/ninja/async-items"]:
            response = await async_client.get(path)
            seen.append((response.status_code, response.get("RateLimit-Policy")))
        return seen

    assert run(body) == [
        (200, '"ninja-paths";q=2;w=60'),
        (200, '"ninja-paths";q=2;w=60'),
        (429, '"ninja-paths";q=2;w=60'),
        (429, '"ninja-paths";q=2;w=60'),  # the path rule covers every operation
    ]


def test_a_decorated_operation_is_decided_by_its_decorator(client: Any) -> None:
    assert codes(client, "/ninja/decorated", 3) == [200, 200, 429]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "server",
    [
        ["uvicorn", "--port", "{port}", "--lifespan", "off", "tests.served:asgi"],
        ["gunicorn", "-b", "127.0.0.1:{port}", "-w", "1", "tests.served:wsgi"],
    ],
    ids=["uvicorn", "gunicorn"],
)
def test_a_real_server(settings: Any, server: list[str]) -> None:
    rule("api-level", "ninja-api", 2, algorithm="fixed_window")
    rule("ninja-paths", "/ninja/async-paths", 1, algorithm="fixed_window")
    with serving(server, settings.DATABASES["default"]) as port:
        seen = [_get(port, "/ninja/async-items") for _ in range(3)]
        seen += [_get(port, "/ninja/items") for _ in range(1)]
        seen += [_get(port, "/ninja/async-paths") for _ in range(2)]
    assert [status for status, _ in seen] == [200, 200, 429, 429, 200, 429]
    assert seen[2][1]["type"].endswith("#quota-exceeded")
    assert seen[2][1]["violated-policies"] == ["api-level"]


def _get(port: int, path: str) -> tuple[int, Any]:
    http = HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        http.request("GET", path, headers={"Accept": PROBLEM})
        response = http.getresponse()
        return response.status, json.loads(response.read())
    finally:
        http.close()


# -- the schema -----------------------------------------------------------------------------


def test_document_limits_describes_covered_operations_only(
    django_capture_on_commit_callbacks: Any,
) -> None:
    rule("api-level", "ninja-api", 10, per=1, unit="hour")
    rule("router-level", "ninja-router", 4)
    schema = api.get_openapi_schema()
    json.dumps(schema, sort_keys=True)  # served as JSON
    paths = schema["paths"]
    items = paths["/ninja/items"]["get"]
    assert items["x-ratelimit"] == [{"name": "api-level", "limit": 10, "period": 3600}]
    too_many = items["responses"][429]
    assert set(too_many["headers"]) == {"Retry-After", "RateLimit", "RateLimit-Policy"}
    assert PROBLEM in too_many["content"]
    assert {"RateLimit", "RateLimit-Policy"} <= set(items["responses"][200]["headers"])
    reports = paths["/ninja/r/reports"]["get"]
    assert [limit["name"] for limit in reports["x-ratelimit"]] == ["router-level"]
    decorated = paths["/ninja/decorated"]["get"]
    assert decorated["x-ratelimit"] == [{"name": "ninja-decorated", "limit": 2, "period": 60}]
    for uncovered in ("/ninja/free", "/ninja/paths"):
        operation = paths[uncovered]["get"]
        assert 429 not in operation["responses"]
        assert "x-ratelimit" not in operation
        assert "headers" not in operation["responses"][200]
    with django_capture_on_commit_callbacks(execute=True):
        rule("everything", "/ninja/", 100)
    again = api.get_openapi_schema()["paths"]["/ninja/free"]["get"]
    assert [limit["name"] for limit in again["x-ratelimit"]] == ["everything"]  # read anew


# -- without the extra ----------------------------------------------------------------------


def test_the_package_imports_without_django_ninja_drf_or_spectacular() -> None:
    code = (
        "import sys\n"
        "for name in ('ninja', 'rest_framework', 'drf_spectacular'): sys.modules[name] = None\n"
        "import django; from django.conf import settings\n"
        "settings.configure(INSTALLED_APPS=['django_throttle']); django.setup()\n"
        "import django_throttle, django_throttle.views, django_throttle.contrib.spectacular\n"
        "try:\n"
        "    import django_throttle.contrib.ninja\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "django_throttle.contrib.ninja needs django-ninja" in out.stdout
    assert "[ninja]" in out.stdout


# -- the status endpoint ----------------------------------------------------------------------


def test_the_status_endpoint_lists_a_ninja_operation_s_rule_throttles() -> None:
    rule("api-level", "ninja-api", 2, algorithm="fixed_window")
    rule("router-level", "ninja-router", 5, algorithm="fixed_window")
    rule("operation-level", "ninja-orders", 3, algorithm="fixed_window")
    from django.test import Client

    def names(path: str) -> set[str]:
        answer = Client().get("/throttle/status/", {"path": path})
        assert answer.status_code == 200
        return {r["name"] for r in answer.json()["rules"]}

    assert names("/ninja/items") == {"api-level"}
    assert names("/ninja/r/reports") == {"router-level"}  # the router's replaces the API's
    assert names("/ninja/orders") == {"operation-level"}
    assert names("/ninja/free") == set()
    client = TestClient(api)
    client.get("/items")
    (api_level,) = Client().get("/throttle/status/", {"path": "/ninja/items"}).json()["rules"]
    assert (api_level["limit"], api_level["remaining"]) == (2, 1)


# -- the example of docs/usage.md ---------------------------------------------------------------


@pytest.mark.urls("tests.recipes.ninja_site.urls")
def test_the_docs_api_throttles_operations_and_routers_and_documents_its_limits(
    client: Any,
) -> None:
    from tests.recipes.ninja_site.api import api as docs_api

    rule("orders", "orders", 1, algorithm="fixed_window")
    rule("reports", "reports", 2, algorithm="fixed_window")
    rule("api", "api", 1, algorithm="fixed_window")  # replaced where a throttle is closer
    rule("search", "/api/search", 2, algorithm="fixed_window")  # RuleThrottle(): its path's
    assert codes(client, "/api/orders", 2) == [200, 429]
    assert client.get("/api/orders", HTTP_ACCEPT="application/json").json()["retry_after"] >= 1
    assert codes(client, "/api/reports/daily", 3) == [200, 200, 429]
    assert codes(client, "/api/search?q=cats", 3) == [200, 200, 429]
    paths = docs_api.get_openapi_schema()["paths"]
    limits = {
        path: [limit["name"] for limit in operation["get"]["x-ratelimit"]]
        for path, operation in paths.items()
    }
    assert limits == {
        "/api/orders": ["orders"],
        "/api/search": ["search"],
        "/api/reports/daily": ["reports"],
    }
