"""A failover is a redirection, not an outage: ``CLUSTER FAILOVER`` on a replica while decisions
run. The old master answers MOVED; the decision follows it to the new master, and no breaker
counts it as a failure, so a fail-closed rule refuses nothing and every count stays exact."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_throttle.compiled import build_rule
from django_throttle.decision import Decision
from django_throttle.engine import deciding, pipeline
from django_throttle.signals import store_state_changed
from django_throttle.state_keys import client_tag
from django_throttle.store import Check, get_store
from django_throttle.store.breaker import CLOSED
from django_throttle.store.cluster import slot_of_tag
from tests.helpers import DECADE_SECONDS
from tests.redis_topology import ClusterHarness
from tests.test_cluster import manual_failover

pytestmark = [pytest.mark.topology]

FAILOVERS = 6  # each master twice: every shard back to its first master
LIMIT = 1_000_000  # never reached: every decision this traffic makes is admitted
WORKERS = 2
NODE_TIMEOUT = 2.0  # seconds: long enough that a loaded machine's nodes never seem down
# A master votes for a shard's failover at most once per two node timeouts; a vote refused
# leaves the manual failover to time out (5 s), its master refusing writes meanwhile.
VOTE_AGAIN = 2 * NODE_TIMEOUT + 0.5


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterHarness]:
    with ClusterHarness(node_timeout_ms=int(NODE_TIMEOUT * 1000)) as harness:
        yield harness


@pytest.fixture(scope="module")
def took_over() -> dict[int, float]:
    """When each master (by port) last took its slots over, in time.monotonic()."""
    return {}


@pytest.fixture
def configured(settings: Any, cluster: ClusterHarness) -> ClusterHarness:
    cluster.wait_steady(replicas=True)
    cluster.flushall()
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "CLUSTER_URL": cluster.url,
        # A master holds writes while its replica catches up (up to 5 s if the failover is
        # given up); this test is about the redirection that follows, not a hung node.
        "TIMEOUT": 6.0,
        "CONNECT_TIMEOUT": 6.0,
        "BREAKER_INTERVAL": 5.0,
        "BLOCK_CACHE": False,
    }
    return cluster


def one_per_master(cluster: ClusterHarness) -> list[str]:
    found: dict[int, str] = {}
    for i in itertools.count():
        identity = f"ip:198.51.100.{i}"
        found.setdefault(cluster.node_for_slot(slot_of_tag(client_tag(identity))), identity)
        if len(found) == 3:
            return list(found.values())
    raise AssertionError("unreachable")


class Load:
    """What the decisions saw: how many admitted per client, and every other outcome."""

    def __init__(self, identities: list[str]) -> None:
        self.rule = build_rule(
            id=1, name="closed", algorithm="fixed_window", limit=LIMIT, period=DECADE_SECONDS,
            fail_mode="closed",
        )  # fmt: skip
        self.identities = identities
        # Alone (one slot group), then all three clients in one request (one group per master).
        self.requests = [[Check(self.rule, i)] for i in identities]
        self.requests.append([Check(self.rule, i) for i in identities])
        self.admitted = dict.fromkeys(identities, 0)
        self.refused: list[Decision] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def seen(self, checks: list[Check], decision: Decision) -> None:
        with self._lock:
            if decision.allowed and not decision.unavailable:
                for check in checks:
                    self.admitted[check.identity] += 1
            else:
                self.refused.append(decision)

    def decide_in_a_loop(self) -> None:
        for checks in itertools.cycle(self.requests):
            if self.stop.is_set():
                return
            self.seen(checks, pipeline.decide(checks))

    async def adecide_in_a_loop(self) -> None:
        for checks in itertools.cycle(self.requests):
            if self.stop.is_set():
                return
            self.seen(checks, await pipeline.adecide(checks))
            await asyncio.sleep(0)


def under_failovers(
    cluster: ClusterHarness,
    took_over: dict[int, float],
    load: Load,
    workers: list[Callable[[], Any]],
) -> None:
    threads = [threading.Thread(target=work) for work in workers]
    for thread in threads:
        thread.start()
    try:
        for n in range(FAILOVERS):
            slot = slot_of_tag(client_tag(load.identities[n % 3]))
            wait = took_over.get(cluster.node_for_slot(slot), 0.0) + VOTE_AGAIN
            time.sleep(max(0.0, wait - time.monotonic()))
            manual_failover(cluster, slot)
            took_over[cluster.node_for_slot(slot)] = time.monotonic()
    finally:
        load.stop.set()
        for thread in threads:
            thread.join()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_manual_failovers_under_load_refuse_nothing_open_no_breaker_and_count_exactly(
    configured: ClusterHarness, took_over: dict[int, float], asynchronous: bool
) -> None:
    cluster = configured
    load = Load(one_per_master(cluster))
    opened: list[dict[str, Any]] = []

    def on_change(sender: Any, **kwargs: Any) -> None:
        if not kwargs.get("available", True):
            opened.append(kwargs)

    store_state_changed.connect(on_change)
    try:
        for checks in load.requests:  # every master connected to and its script loaded
            load.seen(checks, pipeline.decide(checks))
        if asynchronous:

            async def tasks() -> None:
                await asyncio.gather(*(load.adecide_in_a_loop() for _ in range(WORKERS)))

            under_failovers(cluster, took_over, load, [lambda: asyncio.run(tasks())])
        else:
            under_failovers(cluster, took_over, load, [load.decide_in_a_loop] * WORKERS)
    finally:
        store_state_changed.disconnect(on_change)
    guarded = get_store()
    assert load.refused == []
    assert opened == []
    assert guarded.breaker.state == CLOSED
    assert guarded.node_breakers.all_closed()
    # Exact: what Redis counted of each client is what was admitted, no more, no less.
    remaining = {
        identity: deciding.inspect([load.rule], identity)[0].remaining
        for identity in load.identities
    }
    assert remaining == {i: LIMIT - n for i, n in load.admitted.items()}
    assert all(n > FAILOVERS for n in load.admitted.values())
