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
from django.test import override_settings
from django.urls import include, path
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from django_throttle import metrics
from django_throttle.checks import check_settings
from tests.helpers import rule, run
from tests.recipes.metrics_site.urls import metrics as metrics_view
from tests.redis_server import RedisServer
from tests.traffic import wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

OPEN = "/api/items/"  # rule "open": fail_mode=open
CLOSED = "/users/1/"  # rule "closed": fail_mode=closed
PLAIN = "/plain/"

DECISIONS = "django_throttle_decisions_total"
FALLBACK = "django_throttle_fallback_decisions_total"
STORE_COUNT = "django_throttle_store_seconds_count"
STORE_BUCKET = "django_throttle_store_seconds_bucket"
STORE_SUM = "django_throttle_store_seconds_sum"
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


# The scrape view of docs/usage.md for plain prometheus_client, beside the test project's URLs.
urlpatterns = [path("metrics/", metrics_view), path("", include("tests.urls"))]


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
from django_throttle.engine.pipeline import from_results
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
    # Each worker's 0.0003 s in the bucket up to 0.0005 s and not below, and in the sum.
    assert registry.get_sample_value(STORE_BUCKET, {"le": "0.0005"}) == 2
    assert registry.get_sample_value(STORE_BUCKET, {"le": "0.00025"}) == 0
    assert registry.get_sample_value(STORE_SUM) == pytest.approx(0.0006)
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
        "django_throttle_near_limit",
    ):
        assert families[name].type == "counter"
    samples = {(s.name, tuple(sorted(s.labels.items()))) for s in families[DECISIONS[:-6]].samples}
    assert (DECISIONS, (("outcome", "allowed"), ("rule", "everything"))) in samples


@pytest.mark.urls("tests.recipes.metrics_site.urls")
def test_the_docs_urls_serve_the_metrics_at_their_path(client: Any) -> None:
    rule("scraped", "*", 100)
    first = client.get("/metrics")  # decided by the middleware before the view renders
    assert first.status_code == 200 and first["Content-Type"] == CONTENT_TYPE_LATEST
    second = client.get("/metrics")
    counted = [
        sample.value
        for response in (first, second)
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
        if sample.name == DECISIONS and sample.labels == {"rule": "scraped", "outcome": "allowed"}
    ]
    assert counted == [1.0, 2.0]


def test_settings_changes_never_register_the_metrics_twice(configure: Any, client: Any) -> None:
    rule("everything", "*", 100)
    for setting in (True, False, "auto", True):
        configure(METRICS=setting)
        assert client.get(PLAIN).status_code == 200
    names = [family.name for family in REGISTRY.collect()]
    assert names.count("django_throttle_decisions") == 1
    assert names.count("django_throttle_store_seconds") == 1
    assert names.count("django_throttle_near_limit") == 1


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


# The store's histogram and the counters are fed through their value objects
# (metrics._observer, metrics._increment): they must hold what prometheus_client's own
# observe() and inc() would.
AMOUNTS = (0.0, 1e-9, 0.0001, 0.00010001, 0.00025, 0.0004, 0.1, 0.25, 0.2500001, 7.0)


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    return [
        (sample.name, sample.labels, sample.value)
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    ]


def _histogram(registry: CollectorRegistry) -> Any:
    from prometheus_client import Histogram

    return Histogram("h", "h", buckets=metrics.STORE_BUCKETS, registry=registry)


def test_the_store_histogram_fed_directly_holds_what_observe_gives() -> None:
    public, direct = CollectorRegistry(), CollectorRegistry()
    by_observe, fed = _histogram(public), _histogram(direct)
    observe = metrics._observer(fed)
    assert observe != fed.observe  # prometheus_client 0.26's layout: fed directly
    for amount in AMOUNTS:
        by_observe.observe(amount)
        observe(amount)
    assert _samples(direct) == _samples(public)
    assert direct.get_sample_value("h_bucket", {"le": "0.0001"}) == 3  # a bound is its bucket's


def test_counters_fed_directly_hold_what_inc_gives() -> None:
    from prometheus_client import Counter

    public, direct = CollectorRegistry(), CollectorRegistry()
    by_inc = Counter("c", "c", ("rule",), registry=public)
    fed = Counter("c", "c", ("rule",), registry=direct)
    for rule_name, times in (("a", 3), ("b", 1)):
        inc = metrics._increment(fed.labels(rule_name))
        for _ in range(times):
            by_inc.labels(rule_name).inc()
            inc(1)
    assert _samples(direct) == _samples(public)


def test_a_layout_other_than_prometheus_clients_own_is_fed_through_its_methods() -> None:
    from prometheus_client import Counter

    registry = CollectorRegistry()
    histogram = _histogram(registry)
    del histogram._upper_bounds  # as a release that keeps its buckets otherwise would
    assert metrics._observer(histogram) == histogram.observe
    child = Counter("c", "c", ("rule",), registry=registry).labels("a")
    del child._value
    assert metrics._increment(child) == child.inc


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


# -- near the limit -------------------------------------------------------------------------

NEAR = "django_throttle_near_limit_total"


def near(rule_name: str) -> float:
    return value(NEAR, rule=rule_name)


def near_counts(client: Any, rule_names: tuple[str, ...], times: int) -> list[Any]:
    """After each of ``times`` requests to OPEN: its status, then the near counts gained."""
    before = [near(name) for name in rule_names]
    seen = []
    for _ in range(times):
        status = client.get(OPEN).status_code
        seen.append((status, *(near(n) - b for n, b in zip(rule_names, before, strict=True))))
    return seen


def test_admitted_decisions_past_the_ratio_are_near(client: Any) -> None:
    rule("api", "/api/", 10, algorithm="sliding_window_log")  # NEAR_LIMIT_RATIO 0.8: 8 of 10
    seen = near_counts(client, ("api",), 12)
    # Below the ratio nothing; at it (8 used) and past it, one each; a rejection is not near.
    assert seen == [(200, 0)] * 7 + [(200, 1), (200, 2), (200, 3), (429, 3), (429, 3)]


@pytest.mark.parametrize(
    ("ratio", "limit", "first_near"),
    [(0.5, 4, 2), (0.7, 10, 7), (1, 5, 5), (1.0, 1, 1), (0.01, 3, 1), (0.75, 4, 3)],
)
def test_near_limit_ratio_setting(
    client: Any, configure: Any, ratio: float, limit: int, first_near: int
) -> None:
    configure(NEAR_LIMIT_RATIO=ratio)
    rule("api", "/api/", limit, algorithm="sliding_window_log")
    seen = near_counts(client, ("api",), limit)
    # 0.7 * 10 is 7.000000000000001 in floating point: still the 7th request.
    assert [count for _, count in seen] == [max(0, n - first_near + 1) for n in range(1, limit + 1)]


def test_a_rejected_decision_counts_no_rule_near(client: Any, configure: Any) -> None:
    configure(NEAR_LIMIT_RATIO=0.6)  # small: 2 of 2 used; big: 2 of 3
    rule("small", "/api/", 2, algorithm="sliding_window_log")
    rule("big", "/api/", 3, algorithm="sliding_window_log")
    # Small rejects the third request; big admitted it (its result says 2 used, near), but
    # nothing was taken: a rejected decision is counted near for no rule.
    assert near_counts(client, ("small", "big"), 3) == [(200, 0, 0), (200, 1, 1), (429, 1, 1)]


def test_log_only_rules_count_near_until_they_would_reject(client: Any) -> None:
    rule("api", "/api/", 100, algorithm="sliding_window_log")
    rule("trial", "/api/", 3, algorithm="sliding_window_log", action="log")
    seen = near_counts(client, ("api", "trial"), 5)
    # 3 of 3 is near (0.8 * 3 = 2.4: the 3rd); the 4th and 5th would be rejections.
    assert seen == [(200, 0, 0), (200, 0, 0), (200, 0, 1), (200, 0, 1), (200, 0, 1)]


def test_explicit_keys_count_near_by_the_limit_in_force(
    django_capture_on_commit_callbacks: Any,
) -> None:
    from django_throttle import check_key
    from django_throttle.models import Override

    partner = rule("partner", "partner-api", 5, algorithm="sliding_window_log")
    with django_capture_on_commit_callbacks(execute=True):
        Override.objects.create(rule=partner, key="partner:big", limit=10)

    def near_events(key: str, times: int) -> list[tuple[bool, float]]:
        before = near("partner")
        return [
            (check_key("partner-api", key).allowed, near("partner") - before) for _ in range(times)
        ]

    # 0.8 * 5 = 4: the 4th and 5th events; the 6th is rejected.
    assert near_events("partner:acme", 6) == [(True, 0)] * 3 + [(True, 1), (True, 2), (False, 2)]
    # The override's own limit: 0.8 * 10 = 8.
    assert [n for _, n in near_events("partner:big", 10)] == [0] * 7 + [1, 2, 3]


@pytest.mark.parametrize(
    ("setting", "error_id"),
    [
        (0, "django_throttle.E009"),
        (0.0, "django_throttle.E009"),
        (-0.5, "django_throttle.E009"),
        (1.01, "django_throttle.E009"),
        (80, "django_throttle.E009"),
        ("0.8", "django_throttle.E005"),
        (True, "django_throttle.E005"),
        (None, "django_throttle.E005"),
    ],
)
def test_near_limit_ratio_out_of_range_or_not_a_number_is_an_error(
    setting: Any, error_id: str
) -> None:
    with override_settings(DJANGO_THROTTLE={"NEAR_LIMIT_RATIO": setting}):
        messages = check_settings()
        with pytest.raises(SystemCheckError, match=error_id):
            call_command("check")
    assert [m.id for m in messages] == [error_id]
    assert "NEAR_LIMIT_RATIO" in messages[0].msg
    if error_id.endswith("E009"):
        assert "more than 0 and at most 1" in messages[0].msg
    for fine in (0.8, 1, 1.0, 0.001):
        with override_settings(DJANGO_THROTTLE={"NEAR_LIMIT_RATIO": fine}):
            assert check_settings() == []
