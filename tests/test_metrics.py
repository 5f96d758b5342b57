"""Prometheus metrics, read from prometheus_client's default registry after traffic through the
middleware against the real Redis: decisions by rule and outcome, store calls timed, the
store's availability through an outage, the local fallback, METRICS on, off and without
prometheus_client, the system check, and prometheus_client's multi-process mode."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.http import HttpRequest, HttpResponse
from django.test import override_settings
from django.urls import include, path
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from django_throttle import metrics
from django_throttle.checks import check_settings
from tests.helpers import rule, run
from tests.redis_server import RedisServer
from tests.traffic import wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

OPEN = "/api/items/"  # rule "open": fail_mode=open
CLOSED = "/users/1/"  # rule "closed": fail_mode=closed
PLAIN = "/plain/"

DECISIONS = "django_throttle_decisions_total"
FALLBACK = "django_throttle_fallback_decisions_total"
STORE_COUNT = "django_throttle_store_seconds_count"
STORE_AVAILABLE = "django_throttle_store_available"


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def decisions(rule_name: str, outcome: str) -> float:
    return value(DECISIONS, rule=rule_name, outcome=outcome)


def snapshot() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of django_throttle's metrics (creation times left out)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.name.startswith("django_throttle_") and not sample.name.endswith("_created")
    }


def exposition(request: HttpRequest) -> HttpResponse:
    """The scrape view of docs/usage.md for plain prometheus_client."""
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


urlpatterns = [path("metrics/", exposition), path("", include("tests.urls"))]


@pytest.fixture
def configure(settings: Any) -> Any:
    """Set DJANGO_THROTTLE keys for the test; the settings change re-reads METRICS."""

    def apply(**overrides: Any) -> None:
        settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, **overrides}

    return apply


@pytest.fixture
def managed(redis_server: RedisServer) -> RedisServer:
    if not redis_server.managed:
        pytest.skip("an outage is done to a redis-server the harness runs; unset REDIS_URL")
    return redis_server


# -- decisions and store calls ----------------------------------------------------------------


def test_each_rule_result_is_counted_by_rule_and_outcome(client: Any) -> None:
    rule("api", "/api/", 2, algorithm="sliding_window_log")
    rule("watch", "/api/", 1, algorithm="sliding_window_log", action="log")
    before = {
        (name, outcome): decisions(name, outcome)
        for name in ("api", "watch")
        for outcome in ("allowed", "rejected", "shadow_rejected")
    }
    # The log-only rule rejects from the second request on, and never blocks.
    assert [client.get(OPEN).status_code for _ in range(3)] == [200, 200, 429]
    after = {key: decisions(*key) - count for key, count in before.items()}
    assert after == {
        ("api", "allowed"): 2,
        ("api", "rejected"): 1,
        ("api", "shadow_rejected"): 0,
        ("watch", "allowed"): 1,
        ("watch", "rejected"): 0,
        ("watch", "shadow_rejected"): 2,
    }


def test_every_store_call_is_observed_in_the_histogram(client: Any) -> None:
    rule("everything", "*", 100)
    count, infinite = value(STORE_COUNT), value("django_throttle_store_seconds_bucket", le="+Inf")
    total = value("django_throttle_store_seconds_sum")
    assert [client.get(PLAIN).status_code for _ in range(5)] == [200] * 5
    assert value(STORE_COUNT) - count == 5
    assert value("django_throttle_store_seconds_bucket", le="+Inf") - infinite == 5
    assert value("django_throttle_store_seconds_sum") > total


def test_async_requests_are_counted_and_their_store_calls_observed(async_client: Any) -> None:
    rule("everything", "*", 100)
    allowed, count = decisions("everything", "allowed"), value(STORE_COUNT)

    async def body() -> list[int]:
        return [(await async_client.get(PLAIN)).status_code for _ in range(3)]

    assert run(body) == [200] * 3
    assert decisions("everything", "allowed") - allowed == 3
    assert value(STORE_COUNT) - count == 3


# -- an outage ----------------------------------------------------------------------------------


def test_outage_sets_store_available_to_0_then_1_and_counts_fallback_and_unavailable(
    client: Any, configure: Any, managed: RedisServer
) -> None:
    configure(TIMEOUT=0.2, CONNECT_TIMEOUT=0.2, BREAKER_INTERVAL=0.3)
    rule("open", "/api/", 3, fail_mode="open", algorithm="sliding_window_log")
    rule("closed", r"^/users/\d+/$", 3, fail_mode="closed", algorithm="sliding_window_log")
    assert client.get(OPEN).status_code == 200
    assert value(STORE_AVAILABLE) == 1
    before = {
        "fallback allowed": value(FALLBACK, rule="open", outcome="allowed"),
        "fallback rejected": value(FALLBACK, rule="open", outcome="rejected"),
        "open allowed": decisions("open", "allowed"),
        "open rejected": decisions("open", "rejected"),
        "closed unavailable": decisions("closed", "unavailable"),
        "store calls": value(STORE_COUNT),
    }
    managed.kill()
    try:
        codes = [client.get(path).status_code for path in [OPEN] * 4 + [CLOSED]]
        available_during = value(STORE_AVAILABLE)
        after = {
            "fallback allowed": value(FALLBACK, rule="open", outcome="allowed"),
            "fallback rejected": value(FALLBACK, rule="open", outcome="rejected"),
            "open allowed": decisions("open", "allowed"),
            "open rejected": decisions("open", "rejected"),
            "closed unavailable": decisions("closed", "unavailable"),
            "store calls": value(STORE_COUNT),
        }
    finally:
        managed.start()
    # The local fallback enforces the fail-open rule (3 per minute, counted afresh in this
    # process); the fail-closed rule answers 503.
    assert codes == [200, 200, 200, 429, 503]
    assert available_during == 0
    delta = {key: after[key] - before[key] for key in before}
    assert delta.pop("store calls") >= 1  # the call that failed (and any failed probe)
    assert delta == {
        "fallback allowed": 3,
        "fallback rejected": 1,
        "open allowed": 3,
        "open rejected": 1,
        "closed unavailable": 1,
    }
    # The first request after BREAKER_INTERVAL probes the store again and closes the breaker.
    wait_until(lambda: client.get(OPEN).status_code == 200 and value(STORE_AVAILABLE) == 1, 10)


# -- exposition, settings, checks ------------------------------------------------------------

WORKER = """
import sys
import django

django.setup()
from django_throttle import metrics
from django_throttle.compiled import build_rule
from django_throttle.decision import from_results
from django_throttle.store import Result

rule = build_rule(id=1, name="api", algorithm="fixed_window", limit=10, period=60)
assert metrics.switch.on
metrics.decided(from_results([Result(rule, "ip:192.0.2.1", True, 10, 9, 0.0, 0.0, 0.0)]))
metrics.store_timed(0.0003)
metrics.store_state(lambda: sys.argv[1] == "up")
"""


@pytest.mark.slow
def test_multiprocess_mode_adds_up_the_workers(tmp_path: Any) -> None:
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }
    for state in ("up", "down"):  # two workers, the second with its breaker open
        subprocess.run([sys.executable, "-c", WORKER, state], env=env, check=True, timeout=60)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    assert registry.get_sample_value(DECISIONS, {"rule": "api", "outcome": "allowed"}) == 2
    assert registry.get_sample_value(STORE_COUNT) == 2
    # Both workers have exited; a "live" gauge shows only processes not marked dead, which
    # nothing here does: the lowest of the two is the one whose breaker is open.
    assert registry.get_sample_value(STORE_AVAILABLE) == 0


@override_settings(ROOT_URLCONF=__name__)
def test_metrics_are_served_from_the_default_registry(client: Any) -> None:
    rule("everything", "*", 100)
    assert client.get(PLAIN).status_code == 200
    response = client.get("/metrics/")
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.content.decode())}
    assert families["django_throttle_decisions"].type == "counter"
    assert families["django_throttle_store_seconds"].type == "histogram"
    assert families["django_throttle_store_available"].type == "gauge"
    for name in (
        "django_throttle_fallback_decisions",
        "django_throttle_block_cache_decisions",
        "django_throttle_log_flushes",
    ):
        assert families[name].type == "counter"
    samples = {(s.name, tuple(sorted(s.labels.items()))) for s in families[DECISIONS[:-6]].samples}
    assert (DECISIONS, (("outcome", "allowed"), ("rule", "everything"))) in samples


def test_settings_changes_never_register_the_metrics_twice(configure: Any, client: Any) -> None:
    rule("everything", "*", 100)
    for setting in (True, False, "auto", True):
        configure(METRICS=setting)
        assert client.get(PLAIN).status_code == 200
    names = [family.name for family in REGISTRY.collect()]
    assert names.count("django_throttle_decisions") == 1
    assert names.count("django_throttle_store_seconds") == 1


def test_metrics_off_records_nothing(configure: Any, client: Any, managed: RedisServer) -> None:
    configure(METRICS=False, TIMEOUT=0.2, CONNECT_TIMEOUT=0.2, BREAKER_INTERVAL=30)
    rule("api", "/api/", 2)
    rule("open", "/plain/", 2, fail_mode="open")
    rule("closed", r"^/users/\d+/$", 2, fail_mode="closed")
    before = snapshot()
    assert [client.get(OPEN).status_code for _ in range(3)] == [200, 200, 429]
    managed.kill()
    try:
        assert [client.get(path).status_code for path in (PLAIN, CLOSED)] == [200, 503]
    finally:
        managed.start()
    metrics.block_cache_hit("open")
    metrics.log_flushed(True)
    assert snapshot() == before


def test_block_cache_hits_and_log_flushes_are_counted() -> None:
    hits = value("django_throttle_block_cache_decisions_total", rule="api")
    ok = value("django_throttle_log_flushes_total", result="ok")
    failed = value("django_throttle_log_flushes_total", result="error")
    metrics.block_cache_hit("api")
    metrics.block_cache_hit("api")
    metrics.log_flushed(True)
    metrics.log_flushed(False)
    metrics.log_flushed(False)
    assert value("django_throttle_block_cache_decisions_total", rule="api") - hits == 2
    assert value("django_throttle_log_flushes_total", result="ok") - ok == 1
    assert value("django_throttle_log_flushes_total", result="error") - failed == 2


@pytest.mark.parametrize("setting", ["auto", True])
def test_without_prometheus_client_requests_are_decided_and_nothing_recorded(
    setting: Any, configure: Any, client: Any, monkeypatch: Any, caplog: Any
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    configure(METRICS=setting)
    rule("api", "/api/", 2)
    before = snapshot()
    assert [client.get(OPEN).status_code for _ in range(3)] == [200, 200, 429]
    assert snapshot() == before
    told = [r.getMessage() for r in caplog.records if "prometheus_client" in r.getMessage()]
    if setting is True:
        assert len(told) == 1 and metrics.INSTALL_HINT in told[0]
    else:
        assert told == []


def test_e015_metrics_true_without_prometheus_client(monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with override_settings(DJANGO_THROTTLE={"METRICS": True}):
        messages = check_settings()
        with pytest.raises(SystemCheckError, match="E015"):
            call_command("check")
    assert [m.id for m in messages] == ["django_throttle.E015"]
    assert 'pip install "django-throttle-rules[prometheus]"' in (messages[0].hint or "")
    for fine in ("auto", False):
        with override_settings(DJANGO_THROTTLE={"METRICS": fine}):
            assert check_settings() == []


@pytest.mark.parametrize(
    ("setting", "error_id"),
    [("yes", "django_throttle.E004"), (1, "django_throttle.E005"), (None, "django_throttle.E005")],
)
def test_metrics_setting_other_than_true_false_or_auto_is_an_error(
    setting: Any, error_id: str
) -> None:
    with override_settings(DJANGO_THROTTLE={"METRICS": setting}):
        assert [m.id for m in check_settings()] == [error_id]
    for fine in (True, False, "auto"):
        with override_settings(DJANGO_THROTTLE={"METRICS": fine}):
            assert check_settings() == []
