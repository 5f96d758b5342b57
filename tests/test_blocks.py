"""The block cache: a process that saw a client rejected until a known time rejects it itself
until then, without calling Redis; a reset from the admin or a rule change clears it."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY

from django_throttle import check_key, refund_key
from django_throttle.models import Rule
from tests.helpers import rule

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

ADDRESS = "203.0.113.7"
KEY_PAGE = "/admin/django_throttle/dashboard/key/"


def block_cache_hits(rule_name: str) -> float:
    sample = REGISTRY.get_sample_value(
        "django_throttle_block_cache_decisions_total", {"rule": rule_name}
    )
    return sample or 0.0


def flood(client: Any, times: int, path: str = "/api/items/") -> list[Any]:
    return [client.get(path, REMOTE_ADDR=ADDRESS) for _ in range(times)]


def test_a_flood_from_a_rejected_client_costs_one_store_call(client: Any, store_calls: Any) -> None:
    rule("api", "/api/", 2, unit="hour", algorithm="fixed_window")
    calls = store_calls.decisions
    hits = block_cache_hits("api")
    responses = flood(client, 52)
    assert [r.status_code for r in responses] == [200, 200] + [429] * 50
    assert store_calls.decisions - calls == 3  # two admitted, the first rejection
    assert block_cache_hits("api") - hits == 49  # in the metrics, by rule
    # Answered as the store would: the same limit, the window's end, a shrinking wait.
    resets = {r["X-RateLimit-Reset"] for r in responses[2:]}
    assert len(resets) == 1
    waits = [int(r["Retry-After"]) for r in responses[2:]]
    assert waits == sorted(waits, reverse=True) and 1 <= waits[-1] <= 3600


def test_a_blocked_client_is_remembered_for_the_whole_block(client: Any, store_calls: Any) -> None:
    rule("login", "/api/", 1, algorithm="fixed_window", block_seconds=600)
    flood(client, 2)  # admitted, then rejected and blocked
    calls = store_calls.decisions
    responses = flood(client, 20)
    assert {r.status_code for r in responses} == {429}
    assert all(580 <= int(r["Retry-After"]) <= 600 for r in responses)
    assert store_calls.decisions == calls


def test_a_rejection_that_a_cheaper_request_would_pass_is_not_remembered(
    client: Any, store_calls: Any
) -> None:
    """ "heavy" costs what ?n= says: with 2 of 5 left, n=4 is rejected but n=1 still fits."""
    rule("heavy", "heavy", 5, unit="hour", algorithm="fixed_window")
    assert client.get("/heavy/?n=3", REMOTE_ADDR=ADDRESS).status_code == 200
    assert client.get("/heavy/?n=4", REMOTE_ADDR=ADDRESS).status_code == 429
    assert client.get("/heavy/?n=1", REMOTE_ADDR=ADDRESS).status_code == 200


def test_a_reset_from_the_admin_during_a_flood_clears_it(
    admin_client: Any, client: Any, redis_client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    api = rule("api", "/api/", 1, unit="hour", algorithm="fixed_window")
    assert [r.status_code for r in flood(client, 5)] == [200] + [429] * 4
    version = redis_client.get("thr:rules:version")
    blocks = redis_client.get("thr:{thr:rules:version}:blocks")
    admin_client.post(KEY_PAGE, {"rule": api.pk, "key": f"ip:{ADDRESS}"})
    # This process forgets at once; every other one within RULES_REFRESH, when it reads the
    # blocks token that the reset replaced. The rules version stays: nothing reloads.
    assert redis_client.get("thr:{thr:rules:version}:blocks") != blocks
    assert redis_client.get("thr:rules:version") == version
    assert [r.status_code for r in flood(client, 3)] == [200, 429, 429]


def test_a_rule_change_clears_it(client: Any, django_capture_on_commit_callbacks: Any) -> None:
    api = rule("api", "/api/", 1, unit="hour", algorithm="fixed_window")
    assert [r.status_code for r in flood(client, 3)] == [200, 429, 429]
    with django_capture_on_commit_callbacks(execute=True):
        Rule.objects.filter(pk=api.pk).update(limit=3)
    assert [r.status_code for r in flood(client, 3)] == [200, 200, 429]


def test_shadow_rules_and_concurrency_rules_are_never_remembered(
    client: Any, store_calls: Any
) -> None:
    rule("shadow", "/api/", 1, unit="hour", algorithm="fixed_window", action="log")
    flood(client, 3)
    calls = store_calls.decisions
    assert [r.status_code for r in flood(client, 3)] == [200] * 3
    assert store_calls.decisions - calls == 3


def test_a_concurrency_rejection_is_never_remembered(store_calls: Any) -> None:
    """A slot may free at any moment: each request in flight asks the store."""
    rule("in flight", "jobs", 1, algorithm="concurrency")
    assert check_key("jobs", "job:1").allowed  # holds the only slot
    calls = store_calls.decisions
    assert [check_key("jobs", "job:1").allowed for _ in range(3)] == [False] * 3
    assert store_calls.decisions - calls == 3
    refund_key("jobs", "job:1")  # the first one finished
    assert check_key("jobs", "job:1").allowed


def test_a_refund_makes_this_process_forget_the_rejection(store_calls: Any) -> None:
    rule("partner", "partner-api", 1, unit="hour", algorithm="fixed_window")
    assert [check_key("partner-api", "partner:acme").allowed for _ in "ab"] == [True, False]
    refund_key("partner-api", "partner:acme")
    assert check_key("partner-api", "partner:acme").allowed


def test_without_the_block_cache_every_rejection_asks_the_store(
    client: Any, store_calls: Any, settings: Any
) -> None:
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "BLOCK_CACHE": False}
    rule("api", "/api/", 1, unit="hour", algorithm="fixed_window")
    calls = store_calls.decisions
    assert [r.status_code for r in flood(client, 5)] == [200] + [429] * 4
    assert store_calls.decisions - calls == 5


def test_a_remembered_client_is_rejected_while_the_store_is_down(
    client: Any, redis_server: Any, settings: Any
) -> None:
    """Its rejection is known: 429 with the true wait, not the fail-closed rule's 503."""
    if not redis_server.managed:
        pytest.skip("needs a redis-server the harness runs; unset REDIS_URL")
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "TIMEOUT": 0.2,
        "CONNECT_TIMEOUT": 0.2,
        "BREAKER_INTERVAL": 30,
    }
    # A sliding log: its wait is an hour whenever the test runs (a fixed window's is what is
    # left of the clock hour, under a minute in its last one).
    rule("api", "/api/", 1, unit="hour", algorithm="sliding_window_log", fail_mode="closed")
    assert [r.status_code for r in flood(client, 2)] == [200, 429]
    redis_server.pause()
    try:
        during = flood(client, 2)
        other = client.get("/api/items/", REMOTE_ADDR="198.51.100.1")
    finally:
        redis_server.resume()
    assert [r.status_code for r in during] == [429, 429]
    assert int(during[0]["Retry-After"]) > 60
    assert other.status_code == 503  # a client the process knows nothing about: the fail mode


# -- another process: a RuleCache of its own, on its own clock ---------------------------


class OtherProcess:
    """A second process's rule cache (its own rules, block cache and refresh times), reading
    the same Redis and database; counts its loads of the rule table."""

    def __init__(self) -> None:
        from django_throttle.rules import RedisVersion, RuleCache, load_rules

        self.loads = 0
        self.now = 0.0

        def loader(*args: Any) -> Any:
            self.loads += 1
            return load_rules(*args)

        self.cache = RuleCache(RedisVersion(), loader=loader, clock=lambda: self.now)

    def rules(self) -> Any:
        return self.cache.get()

    def later(self) -> Any:
        """Its next request, once RULES_REFRESH has passed."""
        from django_throttle.conf import conf

        self.now += conf.RULES_REFRESH * 1.01
        return self.cache.get()

    def decide(self, scope: str, key: str) -> Any:
        from django_throttle.engine.pipeline import decide
        from django_throttle.rules import scope_rules
        from django_throttle.store import Check

        ruleset = self.rules()
        checks = [Check(r, key, 1) for r in scope_rules(ruleset, scope)]
        return decide(checks, False, ruleset.blocked)


def many_rules(n: int = 300) -> None:
    Rule.objects.bulk_create(Rule(name=f"r{i}", scope=f"/r{i}/", limit=10) for i in range(n))


def test_a_reset_reaches_another_process_block_cache_without_reloading_its_rules(
    store_calls: Any,
) -> None:
    from django_throttle import reset

    many_rules()
    rule("partner", "partner-api", 1, unit="hour", algorithm="fixed_window")
    other = OtherProcess()
    rules = other.rules()
    assert [other.decide("partner-api", "partner:acme").allowed for _ in "ab"] == [True, False]
    calls = store_calls.decisions
    assert not other.decide("partner-api", "partner:acme").allowed  # from its block cache
    assert store_calls.decisions == calls and rules.blocked

    assert reset("partner-api", "partner:acme") == 1  # in this process

    assert other.later() is rules  # the same rules, not reloaded...
    assert other.loads == 1
    assert rules.blocked == {}  # ...and the rejection it remembered is gone
    assert other.decide("partner-api", "partner:acme").allowed


def test_a_refund_reaches_another_process_block_cache_without_reloading_its_rules() -> None:
    many_rules()
    rule("partner", "partner-api", 1, unit="hour", algorithm="fixed_window")
    other = OtherProcess()
    rules = other.rules()
    assert [other.decide("partner-api", "partner:acme").allowed for _ in "ab"] == [True, False]
    assert rules.blocked

    refund_key("partner-api", "partner:acme")  # in this process

    assert other.later() is rules
    assert other.loads == 1
    assert rules.blocked == {}
    assert other.decide("partner-api", "partner:acme").allowed


def test_a_rule_change_keeps_what_is_remembered_under_the_unchanged_rules(
    store_calls: Any, django_capture_on_commit_callbacks: Any
) -> None:
    many_rules()
    rule("partner", "partner-api", 1, unit="hour", algorithm="fixed_window")
    changed = rule("search", "search", 1, unit="hour", algorithm="fixed_window")
    other = OtherProcess()
    before = other.rules()
    for scope in ("partner-api", "search"):
        assert [other.decide(scope, "partner:acme").allowed for _ in "ab"] == [True, False]
    with django_capture_on_commit_callbacks(execute=True):
        Rule.objects.filter(pk=changed.pk).update(limit=3)

    after = other.later()
    assert after is not before and other.loads == 2
    # The rules whose rows did not change are the same compiled objects...
    unchanged = {r.name: r for r in before.rules if r.name != "search"}
    assert all(r is unchanged[r.name] for r in after.rules if r.name != "search")
    calls = store_calls.decisions
    # ...and their remembered rejections stay: no store call.
    assert not other.decide("partner-api", "partner:acme").allowed
    assert store_calls.decisions == calls
    # The changed rule's are dropped: its new limit admits the client again.
    assert other.decide("search", "partner:acme").allowed
    assert store_calls.decisions == calls + 1
