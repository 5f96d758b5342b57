"""The drf-spectacular hook: the limits of every covered operation in the schema, and the OWASP
API rate-limit rules that apply to it (Spectral's owasp:api4:2023-rate-limit*)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import rule

pytest.importorskip("drf_spectacular")
from drf_spectacular.generators import SchemaGenerator  # noqa: E402
from drf_spectacular.settings import patched_settings  # noqa: E402

pytestmark = pytest.mark.django_db

HOOK = "django_throttle.contrib.spectacular.document_limits"
# owasp:api4:2023-rate-limit: a 2xx or 4xx response names one of these header sets.
RATE_LIMIT_HEADER_SETS = [
    {"RateLimit"},
    {"RateLimit-Limit", "RateLimit-Reset"},
    {"X-RateLimit-Limit"},
]


@pytest.fixture
def schema(settings: Any) -> Any:
    settings.REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}

    def generate() -> dict[str, Any]:
        # drf-spectacular reads its settings once, at import: patched as its views patch them.
        with patched_settings({"POSTPROCESSING_HOOKS": [HOOK]}):
            generated = SchemaGenerator().get_schema(request=None, public=True)
        paths: dict[str, Any] = generated["paths"]
        return {path: item["get"] for path, item in paths.items() if path.startswith("/drf/")}

    return generate


def owasp_problems(operation: dict[str, Any]) -> list[str]:
    """What the OWASP rate-limit rules find wrong with an operation."""
    problems = []
    responses = operation["responses"]
    if "429" not in responses:
        problems.append("rate-limit-responses-429: no 429 response")
    elif "Retry-After" not in responses["429"].get("headers", {}):
        problems.append("rate-limit-retry-after: the 429 has no Retry-After")
    for status, response in responses.items():
        if status[:1] in "24":
            names = set(response.get("headers", {}))
            if not any(wanted <= names for wanted in RATE_LIMIT_HEADER_SETS):
                problems.append(f"rate-limit: {status} has no rate-limit header")
    return problems


def test_covered_operations_pass_the_owasp_rate_limit_rules(schema: Any) -> None:
    rule("orders", "drf-orders", 30)  # the DRF RuleThrottle's throttle_scope
    rule("dual-page", "drf-dual", 10, per=1, unit="hour")  # a URL name (and its scope)
    operations = schema()
    covered = {
        "/drf/orders/": [{"name": "orders", "limit": 30, "period": 60}],
        "/drf/dual/": [{"name": "dual-page", "limit": 10, "period": 3600}],
        "/drf/defaulted/": [{"name": "search", "limit": 3, "period": 60}],  # a code default
        "/drf/decorated/{id}/": [{"name": "drf-decorated", "limit": 5, "period": 60}],
    }
    for path, limits in covered.items():
        operation = operations[path]
        assert operation["x-ratelimit"] == limits, path
        assert owasp_problems(operation) == [], path
        too_many = operation["responses"]["429"]
        assert set(too_many["headers"]) == {"Retry-After", "RateLimit", "RateLimit-Policy"}
        problem = too_many["content"]["application/problem+json"]["schema"]
        assert problem["required"] == ["type", "title", "status"]
    # No rule covers it: none of the additions.
    free = operations["/drf/free/"]
    assert "x-ratelimit" not in free
    assert owasp_problems(free) == [
        "rate-limit-responses-429: no 429 response",
        "rate-limit: 200 has no rate-limit header",
    ]


def test_a_path_rule_covers_what_it_matches(schema: Any) -> None:
    rule("drf-everything", "/drf/", 100)
    rule("decorated-only", r"^/drf/decorated/\d+/$", 7)
    operations = schema()
    assert all(owasp_problems(operation) == [] for operation in operations.values())
    assert [limit["name"] for limit in operations["/drf/free/"]["x-ratelimit"]] == [
        "drf-everything"
    ]
    decorated = operations["/drf/decorated/{id}/"]["x-ratelimit"]
    assert [limit["name"] for limit in decorated] == [
        "drf-everything",
        "decorated-only",
        "drf-decorated",
    ]


def test_a_log_rule_documents_nothing(schema: Any) -> None:
    rule("watching", "/drf/free/", 5, action="log")
    assert "x-ratelimit" not in schema()["/drf/free/"]
