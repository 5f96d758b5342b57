"""Decisions on a real six-node Redis Cluster (three masters, three replicas): keys spread over
the masters, every algorithm exact, one call per slot group sent at once, all-or-nothing
across slots, redirections followed, racing processes, and a master killed under load."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from redis.cluster import RedisCluster

from django_throttle.calendar_windows import CalendarWindows
from django_throttle.compiled import build_rule
from django_throttle.rates import UNIT_SECONDS
from django_throttle.state_keys import client_tag
from django_throttle.store import Check, ClusterStore, state_key
from django_throttle.store.base import block_key
from django_throttle.store.cluster import AsyncClusterStore, group_by_slot, slot_of_tag
from django_throttle.store.fallback import StoreUnavailable
from django_throttle.store.guarded import GuardedStore
from django_throttle.store.redis import DECIDE_SOURCE
from tests.clock_shift import shifted
from tests.engine_helpers import ALGORITHMS, make_rule, race_cluster, start_racer
from tests.helpers import run
from tests.redis_topology import ClusterHarness
from tests.traffic import Traffic, database_kept_open, wait_until

pytestmark = [pytest.mark.topology]

INTERVAL = 0.5
TIMEOUT = 0.1


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterHarness]:
    with ClusterHarness() as harness:
        yield harness


@pytest.fixture
def store(cluster: ClusterHarness) -> Iterator[ClusterStore]:
    cluster.flushall()
    made = ClusterStore(RedisCluster.from_url(cluster.url))
    yield made
    made.close()


def on_other_masters(cluster: ClusterHarness, n: int, prefix: str) -> list[str]:
    """``n`` identities whose keys live on ``n`` different masters."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < n:
        identity = f"{prefix}:{i}"
        found.setdefault(cluster.node_for_slot(slot_of_tag(client_tag(identity))), identity)
        i += 1
    return list(found.values())


def evalsha_calls(port: int) -> int:
    with closing(redis.Redis(port=port, socket_timeout=5)) as client:
        stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0))


def test_keys_spread_evenly_over_the_masters(cluster: ClusterHarness, store: ClusterStore) -> None:
    limit = make_rule("fixed_window", 10)
    clients = 10_000
    for start in range(0, clients, 100):
        for i in range(start, start + 100):
            store.decide([Check(limit, f"ip:198.18.{i // 256}.{i % 256}")])
    per_master = cluster.keys_per_master()
    assert len(per_master) == 3 and sum(per_master.values()) == clients
    mean = clients / 3
    print({port: round(n / mean, 3) for port, n in per_master.items()})
    assert max(per_master.values()) <= 1.15 * mean


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_admits_exactly_the_limit(store: ClusterStore, algorithm: str) -> None:
    limit = make_rule(algorithm, 5)
    outcomes = [store.decide([Check(limit, "ip:203.0.113.9")])[0].allowed for _ in range(8)]
    assert outcomes == [True] * 5 + [False] * 3


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_admits_exactly_the_limit_async(
    cluster: ClusterHarness, algorithm: str
) -> None:
    cluster.flushall()
    limit = make_rule(algorithm, 5)

    async def body() -> list[bool]:
        store = AsyncClusterStore.from_url(cluster.url)
        try:
            return [
                (await store.decide([Check(limit, "ip:203.0.113.9")]))[0].allowed for _ in range(8)
            ]
        finally:
            await store.aclose()

    assert run(body) == [True] * 5 + [False] * 3


def test_async_masters_are_reached_on_lean_connections(cluster: ClusterHarness) -> None:
    from django_throttle.store.aio_connection import LeanConnectionStack

    cluster.flushall()
    limit = make_rule("fixed_window", 5)

    async def body() -> list[Any]:
        store = AsyncClusterStore.from_url(cluster.url)
        try:
            await store.decide([Check(limit, f"ip:203.0.113.{n}") for n in range(20)])
            return list(store._stacks.values())
        finally:
            await store.aclose()

    stacks = run(body)
    assert stacks and all(isinstance(s, LeanConnectionStack) for s in stacks)


def test_the_rules_of_one_client_are_one_call(cluster: ClusterHarness, store: ClusterStore) -> None:
    rules = [make_rule(a, 10, rule_id=n) for n, a in enumerate(ALGORITHMS, 1)]
    checks = [Check(r, "ip:203.0.113.10") for r in rules]
    assert len(group_by_slot(checks)) == 1
    store.decide(checks)  # connected, script loaded
    before = sum(evalsha_calls(m.port) for m in cluster.masters())
    assert all(r.allowed for r in store.decide(checks))
    assert sum(evalsha_calls(m.port) for m in cluster.masters()) == before + 1


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_slot_groups_are_sent_at_once(
    cluster: ClusterHarness, settings: Any, asynchronous: bool
) -> None:
    """With the first group's master hung, the second group's master gets its call at once:
    the calls are not made one after the other."""
    cluster.flushall()
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "TIMEOUT": 2.0}
    first, second = on_other_masters(cluster, 2, "user")
    limit = make_rule("fixed_window", 10)
    checks = [Check(limit, first), Check(limit, second)]
    hung = cluster.node(cluster.node_for_slot(slot_of_tag(client_tag(first))))
    other = cluster.node_for_slot(slot_of_tag(client_tag(second)))
    warm, go = threading.Event(), threading.Event()

    def scenario() -> None:
        """Connect to both masters and load the script, then decide once more on ``go``."""
        if asynchronous:

            async def body() -> None:
                store = AsyncClusterStore.from_url(cluster.url)
                try:
                    await store.decide(checks)
                    warm.set()
                    await asyncio.to_thread(go.wait)
                    with contextlib.suppress(redis.RedisError):  # the hung master times out
                        await store.decide(checks)
                finally:
                    await store.aclose()

            run(body)
        else:
            store = ClusterStore(RedisCluster.from_url(cluster.url))
            store.decide(checks)
            warm.set()
            go.wait()
            with contextlib.suppress(redis.RedisError):
                store.decide(checks)
            store.close()

    thread = threading.Thread(target=scenario)
    thread.start()
    try:
        assert warm.wait(10)
        before = evalsha_calls(other)
        hung.pause()
        go.set()
        wait_until(lambda: evalsha_calls(other) == before + 1, within=1.5)
    finally:
        go.set()
        if hung.paused:
            hung.resume()
        thread.join()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_request_rejected_in_one_slot_consumes_nothing_in_another(
    cluster: ClusterHarness, store: ClusterStore, algorithm: str, asynchronous: bool
) -> None:
    """The request's check on another slot committed, then was refunded: its state is as if the
    rejected request never came, for every algorithm."""
    user, address = on_other_masters(cluster, 2, "who")
    generous = make_rule(algorithm, 100, rule_id=1)
    tight = make_rule("fixed_window", 1, rule_id=2)
    checks = [Check(generous, user), Check(tight, address)]

    async def decide_async() -> list[list[Any]]:
        async_store = AsyncClusterStore.from_url(cluster.url)
        try:
            return [await async_store.decide(checks) for _ in range(4)]
        finally:
            await async_store.aclose()

    decisions = run(decide_async) if asynchronous else [store.decide(checks) for _ in range(4)]
    assert [r.allowed for r in decisions[0]] == [True, True]
    for rejected in decisions[1:]:
        assert [r.allowed for r in rejected] == [True, False]
        assert rejected[0].remaining == 99  # what is left: the rejected request took nothing
    # The generous rule's own state: only the first request is in it.
    assert store.decide([Check(generous, user)], dry_run=True)[0].remaining == 99
    key = state_key(generous, user)
    if algorithm in ("fixed_window", "sliding_window_counter"):
        seconds, _ = store.client.time()
        key = f"{key}:{int(seconds) // generous.period}"  # a key per window
        assert int(store.client.get(key)) == 1
    assert store.client.pttl(key) > 0
    if algorithm == "sliding_window_log":
        assert store.client.zcard(key) == 1


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_calendar_quota_is_counted_and_refunded_across_slots(
    cluster: ClusterHarness, store: ClusterStore, asynchronous: bool
) -> None:
    """A monthly quota (in Berlin) on one master, a tight rule on another: the quota counts the
    admitted request only, and says when the month ends."""
    user, address = on_other_masters(cluster, 2, "quota")
    windows = CalendarWindows("month", 1, "Europe/Berlin")
    monthly = build_rule(
        id=1,
        name="monthly",
        algorithm="fixed_window",
        limit=100,
        period=UNIT_SECONDS["month"],
        calendar=windows,
    )
    tight = make_rule("fixed_window", 1, rule_id=2)
    checks = [Check(monthly, user), Check(tight, address)]

    async def decide_async() -> list[list[Any]]:
        async_store = AsyncClusterStore.from_url(cluster.url)
        try:
            return [await async_store.decide(checks) for _ in range(3)]
        finally:
            await async_store.aclose()

    decisions = run(decide_async) if asynchronous else [store.decide(checks) for _ in range(3)]
    assert [[r.allowed for r in d] for d in decisions] == [[True, True]] + [[True, False]] * 2
    assert [d[0].remaining for d in decisions] == [99, 99, 99]
    month_ends = windows.window(time.time())[1]
    assert decisions[-1][0].reset_at == pytest.approx(month_ends, abs=1e-6)
    assert store.decide([Check(monthly, user)], dry_run=True)[0].remaining == 99


def test_calendar_quotas_on_a_cluster_whose_clock_is_months_away() -> None:
    """Every node's clock reads July 2027 in Berlin: each slot group of the first decision
    finds the windows sent wrong, decides nothing, and is sent again with windows around the
    server's time (sync, then async: each store learns the clock once)."""
    moment = datetime(2027, 7, 15, 12, tzinfo=ZoneInfo("Europe/Berlin")).timestamp()
    month_ends = datetime(2027, 8, 1, tzinfo=ZoneInfo("Europe/Berlin")).timestamp()
    windows = CalendarWindows("month", 1, "Europe/Berlin")
    monthly = build_rule(
        id=1,
        name="monthly",
        algorithm="fixed_window",
        limit=10,
        period=UNIT_SECONDS["month"],
        calendar=windows,
    )
    with ClusterHarness(env=shifted(moment - time.time())) as shifted_cluster:
        clients = on_other_masters(shifted_cluster, 2, "far")
        checks = [Check(monthly, who) for who in clients]
        masters = [shifted_cluster.node_for_slot(slot_of_tag(client_tag(c))) for c in clients]
        for port in masters:
            with closing(redis.Redis(port=port)) as node:
                node.script_load(DECIDE_SOURCE)  # a first EVALSHA would get NOSCRIPT
        made = ClusterStore(RedisCluster.from_url(shifted_cluster.url))

        async def decide_async() -> list[list[Any]]:
            async_store = AsyncClusterStore.from_url(shifted_cluster.url)
            try:
                return [await async_store.decide(checks) for _ in range(2)]
            finally:
                await async_store.aclose()

        try:
            calls = [evalsha_calls(port) for port in masters]
            decisions = [made.decide(checks) for _ in range(2)]
            assert [evalsha_calls(p) - c for p, c in zip(masters, calls, strict=True)] == [3, 3]
            decisions += run(decide_async)
            assert [evalsha_calls(p) - c for p, c in zip(masters, calls, strict=True)] == [6, 6]
        finally:
            made.close()
    assert [[r.remaining for r in d] for d in decisions] == [[9, 9], [8, 8], [7, 7], [6, 6]]
    assert {r.reset_at for d in decisions for r in d} == {month_ends}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_refund_leaves_a_shadow_rule_that_rejected_alone(
    cluster: ClusterHarness, store: ClusterStore, algorithm: str
) -> None:
    """A shadow rule that rejected inside a group that committed was not counted there, so
    the refund must not give it anything back."""
    tight_ip, user = on_other_masters(cluster, 2, "shadow")
    tight = make_rule("fixed_window", 1, rule_id=1)
    shadow = make_rule(algorithm, 1, action="log", rule_id=2)
    generous = make_rule(algorithm, 100, rule_id=3)
    store.decide([Check(tight, tight_ip)])  # used up
    store.decide([Check(shadow, user)])  # used up
    results = store.decide([Check(tight, tight_ip), Check(shadow, user), Check(generous, user)])
    assert [r.allowed for r in results] == [False, False, True]
    assert store.decide([Check(shadow, user)], dry_run=True)[0].remaining == 0
    assert store.decide([Check(generous, user)], dry_run=True)[0].remaining == 100


def test_a_log_only_window_counted_past_its_limit_is_refunded_across_slots(
    cluster: ClusterHarness, store: ClusterStore
) -> None:
    """A log-only fixed window counts on past its limit in a group that committed: when another
    slot rejects the request, the refund gives that count back too."""
    tight_ip, user = on_other_masters(cluster, 2, "past")
    tight = make_rule("fixed_window", 1, rule_id=1)
    shadow = make_rule("fixed_window", 1, action="log", rule_id=2)
    store.decide([Check(tight, tight_ip)])  # used up
    assert store.decide([Check(shadow, user)])[0].past == 0  # at its limit
    results = store.decide([Check(tight, tight_ip), Check(shadow, user)])
    assert [(r.allowed, r.past) for r in results] == [(False, 0), (False, 0)]
    seconds, _ = store.client.time()
    key = f"{state_key(shadow, user)}:{int(seconds) // shadow.period}"
    assert int(store.client.get(key)) == 1
    assert store.decide([Check(shadow, user)])[0].past == 1


def test_a_block_lives_in_the_client_s_slot(cluster: ClusterHarness, store: ClusterStore) -> None:
    limit = make_rule("fixed_window", 1, block=600)
    identity = "ip:203.0.113.50"
    assert [store.decide([Check(limit, identity)])[0].blocked for _ in range(2)] == [False, True]
    with closing(
        redis.Redis(port=cluster.node_for_slot(slot_of_tag(client_tag(identity))))
    ) as node:
        assert 590 < node.pttl(block_key(limit, identity)) / 1000 <= 600
    store.reset(limit, identity)
    assert store.decide([Check(limit, identity)])[0].allowed


def test_a_growing_block_keeps_its_level_beside_it(
    cluster: ClusterHarness, store: ClusterStore
) -> None:
    growing = build_rule(
        id=1, name="grows", algorithm="fixed_window", limit=1, period=1, block=1, block_growth=3
    )
    identity = "ip:203.0.113.51"
    seconds = []
    for _ in range(2):
        time.sleep(1.05)  # past the window and the block before
        assert store.decide([Check(growing, identity)])[0].allowed
        (rejected,) = store.decide([Check(growing, identity)])
        seconds.append(round(rejected.retry_after))
    assert seconds == [1, 3]
    assert store.block_levels([Check(growing, identity)]) == [2]
    store.reset(growing, identity)
    assert store.block_levels([Check(growing, identity)]) == [0]


def test_a_dry_run_across_slots_writes_nothing(
    cluster: ClusterHarness, store: ClusterStore
) -> None:
    a, b = on_other_masters(cluster, 2, "dry")
    limit = make_rule("fixed_window", 5)
    results = store.decide([Check(limit, a), Check(limit, b)], dry_run=True)
    assert [r.allowed for r in results] == [True, True]
    assert sum(cluster.keys_per_master().values()) == 0


def manual_failover(cluster: ClusterHarness, slot: int) -> None:
    """CLUSTER FAILOVER on the replica of the slot's master; wait until all nodes agree."""
    cluster.wait_steady(replicas=True)  # a replica demoted by a failover just before resyncs
    old = cluster.node_for_slot(slot)
    replicas = []
    for node in cluster.alive:
        with closing(node.client()) as client:
            if client.info("replication").get("master_port") == old:
                replicas.append(node.port)
    with closing(redis.Redis(port=old, socket_timeout=5)) as master:
        master.execute_command("WAIT", 1, 5000)  # the replica has every write
    for attempt in range(3):  # a manual failover gives up after 5 s on a loaded machine
        with closing(redis.Redis(port=replicas[0], socket_timeout=5)) as client:
            client.execute_command("CLUSTER", "FAILOVER")
        try:
            wait_until(lambda: cluster.node_for_slot(slot) == replicas[0], within=10, step=0.05)
            break
        except AssertionError:
            if attempt == 2:
                raise
    cluster.wait_steady()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_moved_after_a_manual_failover_is_followed(
    cluster: ClusterHarness, store: ClusterStore, asynchronous: bool
) -> None:
    """CLUSTER FAILOVER on a replica: the old master answers MOVED; the slot map is read again
    and the decision goes through, without an error."""
    limit = make_rule("fixed_window", 10)
    identity = "ip:203.0.113.20"
    slot = slot_of_tag(client_tag(identity))
    if not asynchronous:
        assert store.decide([Check(limit, identity)])[0].remaining == 9
        manual_failover(cluster, slot)
        assert store.decide([Check(limit, identity)])[0].remaining == 8
        return

    async def body() -> list[int]:
        async_store = AsyncClusterStore.from_url(cluster.url)
        try:
            first = (await async_store.decide([Check(limit, identity)]))[0].remaining
            manual_failover(cluster, slot)  # blocks the loop: nothing else runs on it here
            second = (await async_store.decide([Check(limit, identity)]))[0].remaining
            return [first, second]
        finally:
            await async_store.aclose()

    assert run(body) == [9, 8]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("flushed", [False, True], ids=["loaded", "flushed"])
def test_ask_during_a_slot_migration_is_followed(
    cluster: ClusterHarness, store: ClusterStore, asynchronous: bool, flushed: bool
) -> None:
    """A slot migrating to another master: a key not yet on the source is asked of the target
    (ASKING), which keeps it; a target without the script runs it from its source, after
    ASKING again."""
    limit = make_rule("fixed_window", 10)
    identity = "ip:203.0.113.30"
    slot = slot_of_tag(client_tag(identity))
    source = cluster.node_for_slot(slot)
    target = next(m.port for m in cluster.masters() if m.port != source)
    with (
        closing(redis.Redis(port=source, socket_timeout=5)) as src,
        closing(redis.Redis(port=target, socket_timeout=5)) as dst,
    ):
        source_id, target_id = (
            src.execute_command("CLUSTER", "MYID"),
            dst.execute_command("CLUSTER", "MYID"),
        )
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        if flushed:
            dst.script_flush()
        else:
            dst.script_load(DECIDE_SOURCE)
        dst.config_resetstat()
        try:
            if asynchronous:

                async def decide() -> Any:
                    async_store = AsyncClusterStore.from_url(cluster.url)
                    try:
                        return (await async_store.decide([Check(limit, identity)]))[0]
                    finally:
                        await async_store.aclose()

                result = run(decide)
            else:
                result = store.decide([Check(limit, identity)])[0]
            assert result.allowed and result.remaining == 9
            assert dst.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 1
            assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
            # Run from its source in one round trip, never loaded apart.
            stats = dst.info("commandstats")
            assert ("cmdstat_eval" in stats) == flushed
            assert "cmdstat_script|load" not in stats
        finally:
            asking = dst.pipeline(transaction=False)  # the target serves the slot after ASKING
            asking.execute_command("ASKING")
            asking.delete(state_key(limit, identity))
            asking.execute()
            for client in (src, dst):
                client.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")


def test_a_flushed_script_is_run_from_its_source_in_one_round_trip_per_slot_group(
    cluster: ClusterHarness, store: ClusterStore
) -> None:
    """A request whose slot groups go to three masters at once, each of them without the
    script (a SCRIPT FLUSH, a failover): each group is run from its source on the connection
    that answered NOSCRIPT, its EVALSHA never sent again."""
    limit = make_rule("fixed_window", 10)
    identities = on_other_masters(cluster, 3, "ip:198.19.0")
    store.decide([Check(limit, identity) for identity in identities])  # connected, loaded
    masters = [redis.Redis(port=m.port, socket_timeout=5) for m in cluster.masters()]
    try:
        for master in masters:
            master.script_flush()
            master.config_resetstat()
        results = store.decide([Check(limit, identity) for identity in identities])
        assert [(r.allowed, r.remaining) for r in results] == [(True, 8)] * 3
        for master in masters:
            stats = master.info("commandstats")
            assert stats["cmdstat_evalsha"]["calls"] == 1  # answered NOSCRIPT
            assert stats["cmdstat_eval"]["calls"] == 1
    finally:
        for master in masters:
            master.close()


def test_tryagain_during_a_migration_costs_that_request_only(
    cluster: ClusterHarness, store: ClusterStore
) -> None:
    """Two rules of one client in a migrating slot whose keys are not all on one side: Redis
    answers TRYAGAIN. That request follows the fail modes; the breaker stays closed, so the
    process's other requests still go to Redis."""
    rules = [make_rule("fixed_window", 10, rule_id=n) for n in (1, 2)]
    identity = "ip:203.0.113.31"
    slot = slot_of_tag(client_tag(identity))
    source = cluster.node_for_slot(slot)
    target = next(m.port for m in cluster.masters() if m.port != source)
    store.decide([Check(rules[0], identity)])  # one key on the source, the other nowhere
    with (
        closing(redis.Redis(port=source, socket_timeout=5)) as src,
        closing(redis.Redis(port=target, socket_timeout=5)) as dst,
    ):
        source_id = src.execute_command("CLUSTER", "MYID")
        target_id = dst.execute_command("CLUSTER", "MYID")
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        try:
            with pytest.raises(redis.exceptions.TryAgainError):
                store.decide([Check(rules[0], identity), Check(rules[1], identity)])
            guarded = GuardedStore()
            guarded.use(store)
            outcome = guarded.decide([Check(r, identity) for r in rules], dry_run=False)
            assert isinstance(outcome, StoreUnavailable)
            assert guarded.breaker.state == "closed"
            assert store.decide([Check(rules[0], "ip:198.51.100.1")])[0].allowed
        finally:
            for client in (src, dst):
                client.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")


@pytest.fixture(scope="module")
def racers() -> Iterator[Any]:
    context = multiprocessing.get_context("spawn")
    pool = context.Pool(8, initializer=start_racer, initargs=(context.Barrier(8),))
    yield pool
    pool.close()
    pool.join()


@pytest.mark.slow
def test_eight_processes_racing_on_one_key_admit_exactly_the_limit(
    cluster: ClusterHarness, racers: Any
) -> None:
    cluster.flushall()
    limit = make_rule("sliding_window_log", 50)
    counts = racers.starmap(
        race_cluster, [(cluster.url, limit, "ip:203.0.113.40", 40)] * 8, chunksize=1
    )
    assert sum(counts) == 50


# -- through the middleware: a master killed under load (last: it changes the cluster) -------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("throttle_middleware")
def test_a_master_killed_under_load(client: Any, settings: Any, cluster: ClusterHarness) -> None:
    cluster.flushall()
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "CLUSTER_URL": cluster.url,
        "TIMEOUT": TIMEOUT,
        "CONNECT_TIMEOUT": TIMEOUT,
        "BREAKER_INTERVAL": INTERVAL,
        "RULES_REFRESH": 3600.0,
    }
    from tests.test_failover import (
        CLOSED,
        OPEN,
        assert_exact,
        assert_failover,
        three_rules,
        warm_up,
    )

    three_rules()
    warm_up(client)
    victim = cluster.node_for_slot(slot_of_tag(client_tag("ip:127.0.0.1")))
    with database_kept_open(), Traffic([OPEN, CLOSED]) as traffic:
        time.sleep(0.5)
        fault_at = time.monotonic()
        cluster.kill_master(victim)
        reachable_at = time.monotonic()  # the replica serves the slots; all nodes agree
        wait_until(lambda: traffic.first_ok_after(CLOSED, reachable_at), within=10)
        time.sleep(0.3)
    figures = assert_failover(traffic, fault_at, reachable_at)
    assert figures["503"] > 0  # the client's master was the one killed
    assert figures["recovery s"] <= INTERVAL + 1.5
    assert_exact(client)
    cluster.revive(victim)
