"""Rules for the engine tests, built directly (no database), and the racers of the concurrency
test (here, so worker processes import no more than they need)."""

from __future__ import annotations

from typing import Any

from django_throttle.compiled import CompiledRule, build_rule

US = 1_000_000
HOUR = 3600

ALGORITHMS = (
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
    "leaky_bucket",
)
BUCKETS = ("token_bucket", "leaky_bucket")


def make_rule(
    algorithm: str,
    limit: int,
    period: int = HOUR,
    *,
    burst: int | None = None,
    action: str = "reject",
    rule_id: int = 1,
    block: int = 0,
) -> CompiledRule:
    """A compiled rule as the rule cache would build it; ``burst`` defaults to ``limit``."""
    return build_rule(
        id=rule_id,
        name=f"rule-{rule_id}",
        algorithm=algorithm,
        limit=limit,
        period=period,
        burst=burst,
        action=action,
        block=block,
    )


# -- the concurrency test's worker processes ----------------------------------

_barrier: Any = None


def start_racer(barrier: Any) -> None:
    """Pool initializer: keep the barrier every race of this worker starts from."""
    global _barrier
    _barrier = barrier


def race(url: str, rule: CompiledRule, identity: str, attempts: int) -> int:
    """With a client of its own, wait for every racer, then decide ``attempts`` requests."""
    import redis

    from django_throttle.store import Check, RedisStore

    client = redis.Redis.from_url(url)
    try:
        store = RedisStore(client)
        store.decide([Check(rule, "warm-up")], dry_run=True)  # connected, script loaded
        _barrier.wait(timeout=60)
        return sum(store.decide([Check(rule, identity)])[0].allowed for _ in range(attempts))
    finally:
        client.close()


def race_cluster(url: str, rule: CompiledRule, identity: str, attempts: int) -> int:
    """``race`` on a Redis Cluster, through the cluster store."""
    from redis.cluster import RedisCluster

    from django_throttle.store import Check, ClusterStore

    store = ClusterStore(RedisCluster.from_url(url))
    try:
        store.decide([Check(rule, "warm-up")], dry_run=True)
        _barrier.wait(timeout=60)
        return sum(store.decide([Check(rule, identity)])[0].allowed for _ in range(attempts))
    finally:
        store.close()


def acquire_worker(
    url: str, database: dict[str, Any], barrier: Any, attempts: int, out: Any
) -> None:
    """An OS process of the keyed-API test: Django set up anew on the test's database (its
    rules) and Redis, acquiring."""
    import os

    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django
    from django.conf import settings

    django.setup()
    from django.db import connections

    connections.settings["default"].update(database)  # the dict every connection reads
    settings.CACHES["default"]["LOCATION"] = url
    from django_throttle import acquire

    barrier.wait()
    for _ in range(attempts):
        decision = acquire("shared-worker", "partner:acme", timeout=10)
        out.put((decision.allowed, decision.reset_at))


def lease_holder(url: str, database: dict[str, Any], ready: Any) -> None:
    """An OS process that takes a concurrency slot and never gives it back (it is killed)."""
    import os
    import time

    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django
    from django.conf import settings

    django.setup()
    from django.db import connections

    connections.settings["default"].update(database)
    settings.CACHES["default"]["LOCATION"] = url
    from django_throttle import check_key

    ready.put(check_key("exports", "user:7").allowed)
    time.sleep(60)
