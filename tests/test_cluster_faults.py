"""Faults on a Redis Cluster stay with their master: one master out of memory, hung (SIGSTOP)
or killed answers the fail mode to the clients whose slots it holds, while the clients of
the other masters are decided in Redis, exactly; a request whose rules span masters is all or
nothing where the store answers, and follows the fail modes for the master that failed.

The cluster's node timeout is a minute here, so no node is declared failed (and no replica
promoted) during a fault: the slot map stays as it was, and the fault stays where it is."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

import pytest
import redis
from django.core.handlers.asgi import ASGIHandler
from redis.cluster import RedisCluster
from redis.crc import key_slot

from django_throttle import acheck_key, check_key
from django_throttle.compiled import CompiledRule, build_rule
from django_throttle.decision import Decision
from django_throttle.engine import pipeline
from django_throttle.engine.refunds import agive_back, give_back, taken
from django_throttle.rejection_log import through_redis
from django_throttle.rules import get_rules
from django_throttle.rules.cache import RedisVersion
from django_throttle.state_keys import client_tag
from django_throttle.store import Check, ClusterStore, aio_connection, get_store
from django_throttle.store.aio_connection import LeanConnectionStack
from django_throttle.store.breaker import CLOSED, OPEN
from django_throttle.store.cluster import AsyncClusterStore, slot_of_tag
from django_throttle.store.connections import AsyncConnectionStack
from tests.helpers import busy_loop, rule, run, statuses
from tests.redis_topology import HOST, ClusterHarness
from tests.traffic import asgi_get, database_kept_open, wait_until

pytestmark = [pytest.mark.topology, pytest.mark.django_db]

INTERVAL = 1.0  # BREAKER_INTERVAL
TIMEOUT = 0.5  # the decision timeout: a hung master costs one request this, per interval
HOUR = 3600
PATH = "/users/1/"  # rule "closed": 5 per hour per ip, fail_mode=closed


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterHarness]:
    with ClusterHarness(node_timeout_ms=60_000) as harness:
        yield harness


@pytest.fixture
def configured(settings: Any, cluster: ClusterHarness) -> ClusterHarness:
    cluster.flushall()
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "CLUSTER_URL": cluster.url,
        "TIMEOUT": TIMEOUT,
        "CONNECT_TIMEOUT": TIMEOUT,
        "BREAKER_INTERVAL": INTERVAL,
        "RULES_REFRESH": 3600.0,
        "BLOCK_CACHE": False,  # every 429 below is Redis's own answer
    }
    return cluster


def master_of(cluster: ClusterHarness, identity: str) -> int:
    return cluster.node_for_slot(slot_of_tag(client_tag(identity)))


def addresses_by_master(cluster: ClusterHarness, per_master: int) -> dict[int, list[str]]:
    """``per_master`` client addresses whose keys live on each master (by port)."""
    found: dict[int, list[str]] = {m.port: [] for m in cluster.masters()}
    for i in itertools.count():
        address = f"198.51.{100 + i // 256}.{i % 256}"
        chosen = found[master_of(cluster, "ip:" + address)]
        if len(chosen) < per_master:
            chosen.append(address)
        if all(len(c) == per_master for c in found.values()):
            return found
    raise AssertionError("unreachable")


def breaker_state(port: int) -> str:
    return get_store().node_breakers.of(f"{HOST}:{port}").state


def a_tag_on(cluster: ClusterHarness, port: int) -> str:
    """A hash tag whose slot the master on ``port`` serves."""
    return next(
        f"fill{i}"
        for i in itertools.count()
        if cluster.node_for_slot(slot_of_tag(f"{{fill{i}}}")) == port
    )


@contextmanager
def out_of_memory(cluster: ClusterHarness, port: int) -> Iterator[None]:
    """The master at its ``maxmemory`` (set just above what it uses, then filled), with
    ``noeviction``: every write answers OOM. Memory freed on the way out."""
    tag = a_tag_on(cluster, port)
    with closing(redis.Redis(host=HOST, port=port, socket_timeout=5)) as node:
        node.config_set("maxmemory-policy", "noeviction")
        used = int(node.info("memory")["used_memory"])
        node.config_set("maxmemory", used + 2_000_000)
        value = b"x" * 100_000
        written = 0
        try:
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                for written in range(1000):  # noqa: B007 (read after the loop)
                    node.set(f"{{{tag}}}:fill:{written}", value)
            # Full. Its buffers (a replica's, a client's) come and go by some 100 KB: with the
            # limit a megabyte under what it holds now, it stays full whatever they do.
            node.config_set("maxmemory", int(node.info("memory")["used_memory"]) - 1_000_000)
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                node.set(f"{{{tag}}}:small", 1)
            yield
        finally:
            node.config_set("maxmemory", 0)
            for i in range(written + 1):
                node.delete(f"{{{tag}}}:fill:{i}")


@contextmanager
def hung_or_killed(cluster: ClusterHarness, port: int, fault: str) -> Iterator[None]:
    node = cluster.node(port)
    if fault == "paused":
        node.pause()
        try:
            yield
        finally:
            node.resume()
        return
    node.kill()
    try:
        yield
    finally:
        node.start()
        cluster.wait_steady(replicas=True)


# -- through the middleware -----------------------------------------------------------------


@pytest.mark.usefixtures("throttle_middleware")
def test_a_master_out_of_memory_fails_closed_only_for_its_clients(
    client: Any, configured: ClusterHarness
) -> None:
    cluster = configured
    rule("closed", r"^/users/\d+/$", 5, fail_mode="closed", algorithm="sliding_window_log")
    by_master = addresses_by_master(cluster, 2)
    sick, *healthy = by_master
    with out_of_memory(cluster, sick):
        # The sick master's clients first: its failure comes before every healthy decision.
        seen = {
            address: statuses(client, PATH, 8, REMOTE_ADDR=address)
            for port in (sick, *healthy)
            for address in by_master[port]
        }
        for port in healthy:
            for address in by_master[port]:
                assert seen[address] == [200] * 5 + [429] * 3, (address, seen)
        for address in by_master[sick]:
            assert seen[address] == [503] * 8, (address, seen)
        assert [breaker_state(port) for port in healthy] == [CLOSED, CLOSED]
        assert breaker_state(sick) != CLOSED
    # Memory freed: after the breaker's interval, the next request probes and closes it, and
    # the sick master's clients are counted from zero (no decision reached it).
    sick_node = get_store().node_breakers.of(f"{HOST}:{sick}")
    wait_until(lambda: not sick_node.is_open(), within=INTERVAL + 1)
    for address in by_master[sick]:
        assert statuses(client, PATH, 8, REMOTE_ADDR=address) == [200] * 5 + [429] * 3
    assert breaker_state(sick) == CLOSED


@pytest.mark.usefixtures("throttle_middleware")
def test_a_master_out_of_memory_under_asgi(configured: ClusterHarness) -> None:
    """The same on the event loop's asyncio store."""
    cluster = configured
    rule("closed", r"^/users/\d+/$", 5, fail_mode="closed", algorithm="sliding_window_log")
    by_master = addresses_by_master(cluster, 1)
    sick, *healthy = by_master
    with database_kept_open():
        app = ASGIHandler()

        async def body() -> dict[str, list[int | None]]:
            seen = {}
            for port in (sick, *healthy):
                (address,) = by_master[port]
                seen[address] = [
                    (await asgi_get(app, PATH, client_ip=address))[0] for _ in range(8)
                ]
            return seen

        with out_of_memory(cluster, sick):
            seen = run(body)
    for port in healthy:
        assert seen[by_master[port][0]] == [200] * 5 + [429] * 3, seen
    assert seen[by_master[sick][0]] == [503] * 8, seen
    assert [breaker_state(port) for port in healthy] == [CLOSED, CLOSED]


@pytest.mark.usefixtures("throttle_middleware")
@pytest.mark.parametrize("fault", ["paused", "killed"])
def test_a_master_hung_or_killed_fails_closed_only_for_its_clients(
    client: Any, configured: ClusterHarness, fault: str
) -> None:
    cluster = configured
    rule("closed", r"^/users/\d+/$", 5, fail_mode="closed", algorithm="sliding_window_log")
    by_master = addresses_by_master(cluster, 2)
    sick, *healthy = by_master
    for port in by_master:  # every master connected to and its script loaded
        assert client.get("/users/2/", REMOTE_ADDR=by_master[port][1]).status_code == 200
    with hung_or_killed(cluster, sick, fault):
        seen = {
            address: statuses(client, PATH, 8, REMOTE_ADDR=address)
            for port in (sick, *healthy)
            for address in by_master[port][:1]
        }
        for port in healthy:
            assert seen[by_master[port][0]] == [200] * 5 + [429] * 3, seen
        assert seen[by_master[sick][0]] == [503] * 8, seen
        assert [breaker_state(port) for port in healthy] == [CLOSED, CLOSED]
        assert breaker_state(sick) != CLOSED


@pytest.mark.usefixtures("throttle_middleware")
def test_a_global_rule_on_a_sick_master_and_ip_rules_on_healthy_ones(
    client: Any, configured: ClusterHarness
) -> None:
    """A request's rules span masters: the global counter's master is out of memory. Its rule
    fails open (the local fallback counts it); the ip rule, on healthy masters, is decided in
    Redis exactly, and a request it rejects takes nothing from the local fallback."""
    cluster = configured
    rule(
        "everyone", "/users/", 100, fail_mode="open", key_kind="global", unit="hour",
        algorithm="fixed_window",
    )  # fmt: skip
    rule("closed", r"^/users/\d+/$", 5, fail_mode="closed", algorithm="sliding_window_log")
    sick = master_of(cluster, "global")
    by_master = addresses_by_master(cluster, 1)
    healthy = [port for port in by_master if port != sick]
    with out_of_memory(cluster, sick):
        seen = {
            by_master[port][0]: statuses(client, PATH, 8, REMOTE_ADDR=by_master[port][0])
            for port in healthy
        }
        assert list(seen.values()) == [[200] * 5 + [429] * 3] * 2, seen
        assert [breaker_state(port) for port in healthy] == [CLOSED, CLOSED]
    # The local fallback counted the global rule for the ten admitted requests only.
    everyone = next(r for r in get_rules().rules if r.name == "everyone")
    assert (
        get_store().local_fallback.decide([Check(everyone, "global")], dry_run=True)[0].remaining
        == 90
    )


# -- the engine: one request, several masters ------------------------------------------------


def compiled(rule_id: int, limit: int, fail_mode: str) -> CompiledRule:
    return build_rule(
        id=rule_id,
        name=f"rule-{rule_id}",
        algorithm="fixed_window",
        limit=limit,
        period=HOUR,
        fail_mode=fail_mode,
    )


def on_master(cluster: ClusterHarness, port: int, prefix: str) -> str:
    return next(
        f"{prefix}:{i}" for i in itertools.count() if master_of(cluster, f"{prefix}:{i}") == port
    )


@pytest.fixture
def spanning(configured: ClusterHarness) -> Iterator[tuple[str, str, ClusterStore]]:
    """Two identities, on the sick (out of memory) and a healthy master, and a store."""
    cluster = configured
    sick, healthy = (m.port for m in cluster.masters()[:2])
    store = ClusterStore(RedisCluster.from_url(cluster.url))
    with out_of_memory(cluster, sick):
        yield on_master(cluster, sick, "user"), on_master(cluster, healthy, "ip"), store
    store.close()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_fail_closed_rule_on_the_sick_master_refuses_the_request_and_takes_nothing(
    spanning: tuple[str, str, ClusterStore], asynchronous: bool
) -> None:
    on_sick, on_healthy = spanning[:2]
    per_ip = compiled(1, 5, "closed")
    per_user = compiled(2, 100, "closed")
    both = [Check(per_ip, on_healthy), Check(per_user, on_sick)]

    async def decide_async() -> list[Any]:
        return [await pipeline.adecide(both), await pipeline.adecide([Check(per_ip, on_healthy)])]

    decisions = (
        run(decide_async)
        if asynchronous
        else [pipeline.decide(both), pipeline.decide([Check(per_ip, on_healthy)])]
    )
    refused, alone = decisions
    # The rule the store could not decide answers: 503, and the healthy master's check
    # committed nothing (refunded).
    assert refused.unavailable and refused.rule == "rule-2" and refused.identity == on_sick
    # The healthy master's clients are decided in Redis meanwhile.
    assert alone.allowed and not alone.unavailable and alone.remaining == 4
    assert not alone.results[0].local


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_fail_open_on_the_sick_master_all_or_nothing_with_the_local_fallback(
    spanning: tuple[str, str, ClusterStore], asynchronous: bool
) -> None:
    """The sick master's rule fails open and the local fallback decides it (limit 2); the
    healthy master's (limit 100) is decided in Redis. A request the local fallback rejects
    gives back what Redis committed for it; a request Redis rejects takes nothing locally."""
    on_sick, on_healthy, store = spanning
    local_two = compiled(1, 2, "open")
    redis_hundred = compiled(2, 100, "closed")
    redis_three = compiled(3, 3, "closed")
    request = [Check(local_two, on_sick), Check(redis_hundred, on_healthy)]
    other = [Check(compiled(4, 100, "open"), on_sick), Check(redis_three, on_healthy)]

    async def decide_async() -> list[Any]:
        return [await pipeline.adecide(checks) for checks in [request] * 4 + [other] * 5]

    decisions = (
        run(decide_async)
        if asynchronous
        else [pipeline.decide(checks) for checks in [request] * 4 + [other] * 5]
    )
    assert [d.allowed for d in decisions] == [True, True, False, False] + [True] * 3 + [False] * 2
    assert not any(d.unavailable for d in decisions)
    assert all(d.results[0].local and not d.results[1].local for d in decisions), [
        [(r.rule.name, r.local, r.allowed) for r in d.results] for d in decisions
    ]
    # In Redis: the two requests the local fallback rejected were given back.
    assert store.decide([Check(redis_hundred, on_healthy)], dry_run=True)[0].remaining == 98
    # Locally: the two requests Redis rejected took nothing.
    assert get_store().local_fallback.decide([other[0]], dry_run=True)[0].remaining == 97


# -- what else talks to a master: rule refreshes, the rejection log, refunds ---------------


def test_rule_refreshes_and_the_rejection_log_consult_their_own_master(
    configured: ClusterHarness,
) -> None:
    """A sick master stops neither reading the rules version nor the rejection log's client
    when their keys live on other masters; a sick master that holds them is not waited on."""
    cluster = configured
    version = RedisVersion()
    holders = {
        cluster.node_for_slot(key_slot(version.key.encode())),
        cluster.node_for_slot(key_slot(through_redis.counts_key().encode())),
    }
    elsewhere = next(m.port for m in cluster.masters() if m.port not in holders)
    closed = compiled(1, 5, "closed")
    with out_of_memory(cluster, elsewhere):
        assert pipeline.decide([Check(closed, on_master(cluster, elsewhere, "ip"))]).unavailable
        version.read()  # does not raise
        assert through_redis.client() is not None
        assert breaker_state(elsewhere) != CLOSED
    holder = cluster.node_for_slot(key_slot(version.key.encode()))
    get_store().node_breakers.reset()
    with out_of_memory(cluster, holder):
        assert pipeline.decide([Check(closed, on_master(cluster, holder, "ip"))]).unavailable
        with pytest.raises(redis.exceptions.ConnectionError, match="circuit breaker"):
            version.read()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_lease_on_a_healthy_master_is_given_back_beside_a_sick_one(
    configured: ClusterHarness, asynchronous: bool
) -> None:
    cluster = configured
    sick, healthy = (m.port for m in cluster.masters()[:2])
    lease = build_rule(
        id=1, name="lease", algorithm="concurrency", limit=1, period=HOUR, fail_mode="closed"
    )
    closed = compiled(2, 5, "closed")
    client = on_master(cluster, healthy, "ip")

    def body() -> list[bool]:
        first = pipeline.decide([Check(lease, client)])
        give_back(taken(first.results))
        return [first.allowed, pipeline.decide([Check(lease, client)]).allowed]

    async def abody() -> list[bool]:
        first = await pipeline.adecide([Check(lease, client)])
        await agive_back(taken(first.results))
        return [first.allowed, (await pipeline.adecide([Check(lease, client)])).allowed]

    with out_of_memory(cluster, sick):
        assert pipeline.decide([Check(closed, on_master(cluster, sick, "ip"))]).unavailable
        assert (run(abody) if asynchronous else body()) == [True, True]
        assert breaker_state(healthy) == CLOSED


def test_a_node_s_breaker_is_forgotten_when_the_slot_map_no_longer_names_it(
    configured: ClusterHarness,
) -> None:
    cluster = configured
    gone = "192.0.2.1:7000"  # a node that left the cluster
    get_store().node_breakers.of(gone).failed(OSError("down"), 0)
    store = ClusterStore(RedisCluster.from_url(cluster.url))
    store.node_breakers = get_store().node_breakers  # the process's, as its own store's
    try:
        store.decide([Check(compiled(1, 5, "closed"), "ip:203.0.113.1")])
        assert gone in get_store().node_breakers.nodes()
        store._refresh()  # as after a node's failure
    finally:
        store.close()
    known = {f"{HOST}:{node.port}" for node in cluster.alive}
    assert set(get_store().node_breakers.nodes()) <= known


@pytest.mark.usefixtures("throttle_middleware")
def test_a_cancelled_probe_of_a_hung_master_frees_its_breaker(
    configured: ClusterHarness, settings: Any
) -> None:
    """Under ASGI, the probe of a hung master is cancelled (its client hangs up): the next
    request to that master probes at once; a healthy master's client is served meanwhile."""
    cluster = configured
    # The probe waits far longer than its client takes to hang up, even on a loaded machine.
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "TIMEOUT": 1.0, "CONNECT_TIMEOUT": 1.0}
    rule("closed", r"^/users/\d+/$", 5, fail_mode="closed", algorithm="sliding_window_log")
    by_master = addresses_by_master(cluster, 1)
    sick, healthy = list(by_master)[:2]
    (address,), (other,) = by_master[sick], by_master[healthy]
    node = cluster.node(sick)
    with database_kept_open():
        app = ASGIHandler()

        async def body() -> list[Any]:
            seen = [(await asgi_get(app, PATH, client_ip=address))[0]]  # connected, loaded
            node.pause()
            try:
                seen.append((await asgi_get(app, PATH, client_ip=address))[0])  # times out
                seen.append((await asgi_get(app, PATH, client_ip=other))[0])
                assert seen == [200, 503, 200]
                assert breaker_state(sick) == OPEN
                await asyncio.sleep(INTERVAL)
                hung_up = await asgi_get(app, PATH, disconnect_after=0.05, client_ip=address)
                seen.append(hung_up[0])
                assert breaker_state(sick) == OPEN  # given back: not PROBING
            finally:
                node.resume()
            seen += [(await asgi_get(app, PATH, client_ip=address))[0] for _ in range(2)]
            return seen

        seen = run(body)
    assert seen == [200, 503, 200, None, 200, 200]
    assert breaker_state(sick) == CLOSED


@pytest.mark.parametrize("async_kind", ["lean", "redis.asyncio"])
def test_a_burst_on_a_busy_loop_is_decided_on_every_master(
    configured: ClusterHarness, settings: Any, monkeypatch: pytest.MonkeyPatch, async_kind: str
) -> None:
    """As on one server (tests/test_not_the_store.py): forty decisions spread over the three
    masters, on a loop that works 50 ms per turn, with every timeout at 0.1 s. The slot map
    is read on the busy loop (the loop's store is made there, and reads it again before the
    second burst, as after a failover); new connections and replies are timed by each
    node's answer, on either kind of asyncio connection (redis.asyncio's where hiredis is
    missing): no decision fails, no breaker opens."""
    if async_kind == "redis.asyncio":
        monkeypatch.setattr(aio_connection, "HIREDIS", False)
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "TIMEOUT": 0.1, "CONNECT_TIMEOUT": 0.1}
    rule("burst", "burst", 1_000_000, unit="day", fail_mode="closed", algorithm="fixed_window")
    check_key("burst", "warm", dry_run=True)  # the rules loaded (the database is not the loop's)
    clients = [f"client:{n}" for n in range(20)]
    assert {master_of(configured, c) for c in clients} == {m.port for m in configured.masters()}

    async def burst() -> tuple[set[type], list[Decision]]:
        _, stop = busy_loop()
        try:
            decisions = list(await asyncio.gather(*(acheck_key("burst", c) for c in clients)))
            store = await get_store().async_backend()
            assert isinstance(store, AsyncClusterStore)
            store._stale = True  # the slot map read again before the next decision
            decisions += await asyncio.gather(*(acheck_key("burst", c) for c in clients))
            assert not store._stale
        finally:
            stop()
        return {type(s) for s in store._stacks.values()}, decisions

    kinds, decisions = run(burst)
    assert kinds == {LeanConnectionStack if async_kind == "lean" else AsyncConnectionStack}
    assert [d.unavailable for d in decisions] == [False] * 2 * len(clients)
    assert all(d.allowed for d in decisions)
    assert get_store().breaker.state == CLOSED
    assert get_store().node_breakers.all_closed()
