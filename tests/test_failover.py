"""A primary that fails over, seen through the middleware: a managed Redis switched over behind
its address (a TCP proxy here), and Sentinel, under WSGI and ASGI.

For each fault: no 500, 503 with Retry-After only on the fail-closed rule and only until the
new primary is in use, limiting exact again afterwards, and the time to recover measured.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from typing import Any

import pytest
import redis

from django_throttle import acheck, acheck_key, check, check_key
from django_throttle.store import Check, RedisStore, aio_connection, get_store
from django_throttle.store.breaker import CLOSED as BREAKER_CLOSED
from django_throttle.store.redis import DECIDE_SHA, client_from_cache
from tests.engine_helpers import make_rule
from tests.helpers import DECADE, busy_loop, rule, run
from tests.redis_topology import ReplicatedRedis, SentinelGroup, TcpProxy
from tests.traffic import Traffic, database_kept_open, wait_until

pytestmark = [pytest.mark.topology, pytest.mark.usefixtures("throttle_middleware")]

INTERVAL = 0.5  # BREAKER_INTERVAL of these tests
TIMEOUT = 0.1
MARGIN = 1.5  # slack for a loaded machine on top of what the design allows
OPEN = "/api/items/"  # fail-open rule, never limited by this traffic
CLOSED = "/users/1/"  # fail-closed rule, never limited by this traffic
EXACT = "/shop/named/"  # 5 per ten years, requested only after the fault


def throttle_settings(settings: Any, cache: dict[str, Any]) -> None:
    settings.CACHES = {**settings.CACHES, "default": cache}
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "TIMEOUT": TIMEOUT,
        "CONNECT_TIMEOUT": TIMEOUT,
        "BREAKER_INTERVAL": INTERVAL,
        "RULES_REFRESH": 3600.0,  # the traffic's threads never read the database
    }


def sentinel_cache(group: SentinelGroup, **options: Any) -> dict[str, Any]:
    """A cache configured as django-redis documents Sentinel."""
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{group.service_name}/0",
        "OPTIONS": {
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "SENTINELS": group.sentinels,
            **options,
        },
    }


def three_rules() -> None:
    rule("open", "/api/", 1_000_000, fail_mode="open", algorithm="fixed_window")
    rule("closed", r"^/users/\d+/$", 1_000_000, fail_mode="closed", algorithm="fixed_window")
    rule("exact", "shop:named", 5, **DECADE, fail_mode="closed", algorithm="fixed_window")


def warm_up(client: Any) -> None:
    assert [client.get(p).status_code for p in (OPEN, CLOSED)] == [200, 200]


def assert_failover(traffic: Traffic, fault_at: float, reachable_at: float) -> dict[str, float]:
    """What the traffic saw; returns the figures (printed with -s)."""
    answers = traffic.answers
    statuses = {a.status for a in answers}
    assert statuses <= {200, 503}, statuses  # never a 500, never limited by this traffic
    assert all(a.status == 200 for a in traffic.on(OPEN))  # fail-open: the local fallback
    unavailable = [a for a in answers if a.status == 503]
    assert all(a.path == CLOSED and int(a.retry_after or 0) >= 1 for a in unavailable)
    recovered = traffic.first_ok_after(CLOSED, reachable_at)
    assert recovered is not None
    # 503 only during the fault: none sent after limiting had resumed.
    assert all(fault_at <= a.received and a.sent <= recovered.received for a in unavailable)
    figures = {
        "requests": len(answers),
        "503": len(unavailable),
        "503 window s": (unavailable[-1].received - unavailable[0].sent) if unavailable else 0.0,
        "recovery s": recovered.received - reachable_at,
    }
    print(figures)
    return figures


def assert_exact(client: Any) -> None:
    assert [client.get(EXACT).status_code for _ in range(6)] == [200] * 5 + [429]


# -- a managed primary switched over behind its address -------------------------------------


@pytest.fixture
def pair() -> Iterator[tuple[ReplicatedRedis, TcpProxy]]:
    replicated = ReplicatedRedis()
    proxy = TcpProxy(replicated.primary.port)
    yield replicated, proxy
    proxy.close()
    replicated.close()


def script_loads(port: int) -> int:
    with closing(redis.Redis(port=port, socket_timeout=5)) as client:
        stats = client.info("commandstats").get("cmdstat_script|load", {})
    return int(stats.get("calls", 0))


def test_readonly_drops_the_connections_and_noscript_loads_on_the_new_primary(
    pair: tuple[ReplicatedRedis, TcpProxy],
) -> None:
    replicated, proxy = pair
    client = redis.Redis.from_url(proxy.url)
    store = RedisStore(client)
    limit = make_rule("fixed_window", 10)
    assert store.decide([Check(limit, "ip:1")])[0].allowed  # connected to the primary
    old, new = replicated.primary.port, replicated.replica.port
    replicated.switchover()
    # The address still leads to the old primary, now a replica: READONLY, and again on the
    # one new connection tried.
    with pytest.raises(redis.ReadOnlyError):
        store.decide([Check(limit, "ip:1")])
    proxy.switch(new)
    loads_on_old = script_loads(old)
    # The address now leads to the new primary, which has no script yet: it is loaded there,
    # on the decision's connection, and the decision goes through.
    result = store.decide([Check(limit, "ip:1")])[0]
    assert result.allowed and result.remaining == 8  # the count replicated before the switch
    with closing(redis.Redis(port=new)) as node:
        assert node.script_exists(DECIDE_SHA) == [True]
    assert script_loads(old) == loads_on_old
    client.close()


def test_a_decision_refused_with_readonly_goes_once_more_to_the_new_primary(
    pair: tuple[ReplicatedRedis, TcpProxy],
) -> None:
    """The open connection leads to the demoted primary; the decision is sent again on a new
    connection, which the moved address leads to the new primary: no error at all."""
    replicated, proxy = pair
    store = RedisStore(redis.Redis.from_url(proxy.url))
    limit = make_rule("fixed_window", 10)
    assert store.decide([Check(limit, "ip:1")])[0].allowed
    replicated.switchover()
    proxy.switch(replicated.primary.port)
    assert store.decide([Check(limit, "ip:1")])[0].remaining == 8
    store.client.close()


@pytest.mark.django_db(transaction=True)
def test_switchover_under_load_recovers_within_the_breaker_interval(
    client: Any, settings: Any, pair: tuple[ReplicatedRedis, TcpProxy]
) -> None:
    replicated, proxy = pair
    throttle_settings(settings, {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": proxy.url})
    three_rules()
    warm_up(client)
    with database_kept_open(), Traffic([OPEN, CLOSED]) as traffic:
        time.sleep(0.5)
        fault_at = time.monotonic()
        replicated.switchover()
        proxy.switch(replicated.primary.port)
        reachable_at = time.monotonic()
        wait_until(lambda: traffic.first_ok_after(CLOSED, reachable_at), within=10)
        time.sleep(0.3)
    figures = assert_failover(traffic, fault_at, reachable_at)
    assert figures["recovery s"] <= INTERVAL + MARGIN
    assert_exact(client)


# -- Sentinel ---------------------------------------------------------------------------------


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    # A service name of its own: django-redis keeps a pool per LOCATION for the process.
    with SentinelGroup(service_name=f"svc{next(_groups)}") as sentinels:
        yield sentinels


_groups = itertools.count()


def test_sentinel_decisions_get_the_decision_timeouts(settings: Any, group: SentinelGroup) -> None:
    throttle_settings(settings, sentinel_cache(group, SOCKET_TIMEOUT=5, SOCKET_CONNECT_TIMEOUT=5))
    client, owned = client_from_cache("default")
    kwargs = client.connection_pool.connection_kwargs
    assert owned and (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (0.1, 0.1)
    sentinel = client.connection_pool.sentinel_manager.sentinels[0]
    assert sentinel.connection_pool.connection_kwargs["socket_timeout"] == TIMEOUT
    client.close()


def test_async_sentinel_decisions_on_lean_connections(settings: Any, group: SentinelGroup) -> None:
    """The asyncio store asks the Sentinels for the primary and decides on a lean connection."""
    from django_throttle.store.aio_connection import LeanConnectionStack
    from django_throttle.store.redis import AsyncRedisStore

    throttle_settings(settings, sentinel_cache(group))
    limit = make_rule("fixed_window", 2)

    async def body() -> tuple[Any, list[bool]]:
        store = AsyncRedisStore.from_cache("default")
        try:
            outcomes = [(await store.decide([Check(limit, "ip:1")]))[0].allowed for _ in range(3)]
            return store._stack, outcomes
        finally:
            await store.aclose()

    stack, outcomes = run(body)
    assert isinstance(stack, LeanConnectionStack)
    assert outcomes == [True, True, False]
    primary = group.master()
    with closing(redis.Redis(port=primary.port)) as direct:
        assert direct.info("commandstats")["cmdstat_evalsha"]["calls"] >= 3


@pytest.mark.django_db
@pytest.mark.parametrize("async_kind", ["lean", "redis.asyncio"])
def test_a_burst_on_a_busy_loop_asks_the_sentinels_and_decides(
    settings: Any, group: SentinelGroup, monkeypatch: pytest.MonkeyPatch, async_kind: str
) -> None:
    """As on one server (tests/test_not_the_store.py), through the Sentinels: the loop's store
    is made on a loop busy 50 ms per turn, so the Sentinels are asked for the primary there,
    and the burst connects to it there. Timed by the Sentinels' and the primary's answers, no
    decision fails and the breaker stays closed."""
    if async_kind == "redis.asyncio":
        monkeypatch.setattr(aio_connection, "HIREDIS", False)
    throttle_settings(settings, sentinel_cache(group))
    rule("burst", "burst", 1_000_000, unit="day", fail_mode="closed", algorithm="fixed_window")
    check_key("burst", "warm", dry_run=True)  # the rules loaded (the database is not the loop's)

    async def burst() -> list[Any]:
        _, stop = busy_loop()
        try:
            decisions = [acheck_key("burst", f"client:{n}") for n in range(20)]
            return list(await asyncio.gather(*decisions))
        finally:
            stop()

    decisions = run(burst)
    assert [d.unavailable for d in decisions] == [False] * 20
    assert all(d.allowed for d in decisions)
    assert get_store().breaker.state == BREAKER_CLOSED


def test_closing_the_store_closes_its_connections_to_the_sentinels(
    settings: Any, group: SentinelGroup
) -> None:
    """The store asks Sentinels of its own (with the decision timeouts): closing it closes those
    connections too, not only the primary's; else they wait for the garbage collector."""
    throttle_settings(settings, sentinel_cache(group))
    store = RedisStore.from_cache("default")
    assert store.decide([Check(make_rule("fixed_window", 5), "ip:1")])[0].allowed
    sentinels = store.client.connection_pool.sentinel_manager.sentinels
    ours = {
        "{}:{}".format(*conn._sock.getsockname())
        for sentinel in sentinels
        for conn in sentinel.connection_pool._available_connections
        if conn._sock is not None
    }
    assert ours  # the primary was asked of them

    def still_open() -> set[str]:
        seen = set()
        for _, port in group.sentinels:
            with closing(redis.Redis(port=port, socket_timeout=5)) as sentinel:
                seen |= {c["addr"] for c in sentinel.client_list()}
        return ours & seen

    assert still_open() == ours
    store.close()
    wait_until(lambda: not still_open(), within=5)


@pytest.mark.django_db
@pytest.mark.parametrize("asgi", [False, True], ids=["wsgi", "asgi"])
def test_a_hung_sentinel_primary_costs_one_decision_timeout(
    rf: Any, settings: Any, group: SentinelGroup, asgi: bool
) -> None:
    """The cache waits 5 s for a reply; a decision waits TIMEOUT, then the rule's fail mode."""
    throttle_settings(settings, sentinel_cache(group, SOCKET_TIMEOUT=5, SOCKET_CONNECT_TIMEOUT=5))
    rule("closed", "login", 5, fail_mode="closed")

    def decide() -> Any:
        request = rf.get("/login/")
        if asgi:
            return run(lambda: acheck(request, "login"))
        return check(request, "login")

    assert decide().allowed  # connected through the Sentinels, script loaded
    group.master().pause()
    try:
        started = time.monotonic()
        decision = decide()
        waited = time.monotonic() - started
    finally:
        group.master().resume()
    assert not decision.allowed and decision.unavailable
    assert waited < 5 * TIMEOUT + MARGIN  # far from the cache's 5 s


def demoted(server: Any) -> bool:
    """Whether Sentinel has made the old primary a replica."""
    try:
        with closing(server.client(socket_timeout=1)) as node:
            return bool(node.info("replication")["role"] == "slave")
    except redis.ConnectionError:
        return False  # the node drops its clients as it changes role: ask again


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("asgi", [False, True], ids=["wsgi", "asgi"])
def test_sentinel_failover_under_load(
    client: Any, settings: Any, group: SentinelGroup, asgi: bool
) -> None:
    """SENTINEL FAILOVER of a healthy primary: the old primary takes writes until Sentinel
    demotes it (Sentinel's INFO period, up to 10 s); then READONLY drops the connections and
    the next decisions ask the Sentinels for the new primary."""
    throttle_settings(settings, sentinel_cache(group))
    three_rules()
    warm_up(client)
    old = group.master()
    with database_kept_open(), Traffic([OPEN, CLOSED], asgi=asgi) as traffic:
        time.sleep(0.5)
        fault_at = time.monotonic()
        group.failover()
        wait_until(lambda: demoted(old), within=30, step=0.05)
        reachable_at = time.monotonic()  # from here only the new primary takes writes
        wait_until(lambda: traffic.first_ok_after(CLOSED, reachable_at), within=10)
        time.sleep(0.3)
    figures = assert_failover(traffic, fault_at, reachable_at)
    assert figures["recovery s"] <= INTERVAL + MARGIN
    assert_exact(client)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("asgi", [False, True], ids=["wsgi", "asgi"])
def test_a_sentinel_demotion_fails_only_the_decisions_it_cuts(
    client: Any, settings: Any, group: SentinelGroup, asgi: bool
) -> None:
    """When Sentinel demotes the old primary it closes its clients' connections: a decision in
    flight then fails alone (its request takes the fail mode), the breaker stays closed, and
    the next decisions go to the new primary at once."""
    from django_throttle.signals import store_state_changed

    throttle_settings(settings, sentinel_cache(group))
    # Cuts are what this test is about: a timeout of a loaded machine's making is another fault.
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "TIMEOUT": 1.0}
    three_rules()
    warm_up(client)
    outages: list[dict[str, Any]] = []

    def record(sender: Any, **kwargs: Any) -> None:
        if not kwargs.get("available", True):
            outages.append(kwargs)

    store_state_changed.connect(record)
    old = group.master()
    try:
        with database_kept_open(), Traffic([OPEN, CLOSED], asgi=asgi) as traffic:
            time.sleep(0.3)
            group.failover()
            wait_until(lambda: demoted(old), within=30, step=0.05)
            time.sleep(1.5)  # past the demotion's disconnections, three breaker intervals
    finally:
        store_state_changed.disconnect(record)
    statuses = [a.status for a in traffic.answers]
    assert set(statuses) <= {200, 503}, set(statuses)
    assert outages == []  # no breaker opened: the store was never unavailable
    # At most the decisions in flight when the connections were cut: one per worker.
    assert statuses.count(503) <= traffic.workers, statuses.count(503)
    assert_exact(client)


def counted(server: Any) -> int:
    """What the fixed windows on ``server`` have counted, all clients together."""
    from tests.helpers import window_keys

    with closing(server.client(socket_timeout=2)) as node:
        return sum(int(node.get(key) or 0) for key in window_keys(node))


def tenants_on(settings: Any, group: SentinelGroup) -> Any:
    """The tenants rule on the group's primary, refreshed every 0.1 s; that primary."""
    throttle_settings(settings, sentinel_cache(group))
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "RULES_REFRESH": 0.1}
    rule("tenants", "tenants", 1000, **DECADE, algorithm="fixed_window")
    return group.master()


@pytest.mark.django_db
def test_a_sentinel_failover_moves_decisions_to_the_new_primary_within_a_refresh(
    settings: Any, group: SentinelGroup
) -> None:
    """After SENTINEL FAILOVER the old primary takes writes until Sentinel demotes it, up to
    10 s later. The rules refresh asks the Sentinels for the primary, so within RULES_REFRESH
    every decision goes to the new one: a client is never counted on both."""
    from django_throttle import check_key

    old = tenants_on(settings, group)
    assert all(check_key("tenants", "acme").allowed for _ in range(3))
    assert counted(old) == 3
    _, new_port = group.failover()
    time.sleep(0.3)  # past a rules refresh
    assert all(check_key("tenants", "acme").allowed for _ in range(5))
    assert counted(old) == 3  # still a primary, yet no longer written to
    assert counted(group.server(new_port)) == 3 + 5  # 3 replicated before, then every one


@pytest.mark.django_db(transaction=True)
def test_a_sentinel_failover_moves_async_decisions_to_the_new_primary_within_a_refresh(
    settings: Any, group: SentinelGroup
) -> None:
    """The same on an event loop's lean connections: they follow the primary the rules
    refresh heard of from the Sentinels."""
    from asgiref.sync import sync_to_async

    from django_throttle import acheck_key

    old = tenants_on(settings, group)

    async def decide(n: int) -> list[bool]:
        return [(await acheck_key("tenants", "acme")).allowed for _ in range(n)]

    async def body() -> tuple[list[bool], int, int, list[bool]]:
        # One loop throughout, so its store (and its connections) lives through the failover.
        first = await decide(3)
        before = await sync_to_async(counted)(old)
        _, port = await sync_to_async(group.failover)()
        await asyncio.sleep(0.3)  # past a rules refresh
        return first, before, port, await decide(5)

    first, before, new_port, after = run(body)
    assert all(first) and before == 3
    assert all(after)
    assert counted(old) == 3  # still a primary, yet no longer written to
    assert counted(group.server(new_port)) == 3 + 5


# -- min-replicas-to-write: a primary that refuses writes with NOREPLICAS --------------------


def script_runs(port: int) -> int:
    """EVALSHA and EVAL calls a server has run, failed ones included."""
    with closing(redis.Redis(port=port, socket_timeout=5)) as client:
        stats = client.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval")
    )


def refuses_writes(port: int) -> bool:
    with closing(redis.Redis(port=port, socket_timeout=1)) as client:
        try:
            client.set("probe", 1)
        except redis.ResponseError as error:
            return str(error).startswith("NOREPLICAS")
    return False


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("asgi", [False, True], ids=["wsgi", "asgi"])
def test_noreplicas_with_no_replica_promoted_follows_the_fail_modes(
    settings: Any, asgi: bool
) -> None:
    """A primary with min-replicas-to-write whose replica died answers NOREPLICAS: no server
    took over, so the decision is sent once, and each rule follows its fail mode."""
    with ReplicatedRedis() as replicated:
        primary = replicated.primary
        with closing(primary.client()) as node:
            node.config_set("min-replicas-to-write", 1)
        cache = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": primary.url}
        throttle_settings(settings, cache)
        rule("closed", "fenced-closed", 100, **DECADE, fail_mode="closed")
        rule("open", "fenced-open", 100, **DECADE, fail_mode="open")

        def decide(scope: str) -> Any:
            if asgi:
                from django_throttle import acheck_key

                return run(lambda: acheck_key(scope, "acme"))
            from django_throttle import check_key

            return check_key(scope, "acme")

        assert decide("fenced-closed").allowed and decide("fenced-open").allowed
        replicated.replica.kill()
        wait_until(lambda: refuses_writes(primary.port), within=10)
        runs, before = script_runs(primary.port), counted(primary)
        closed = decide("fenced-closed")
        assert script_runs(primary.port) == runs + 1  # not sent again
        assert counted(primary) == before  # refused at its first write: nothing written
        opened = decide("fenced-open")
    assert not closed.allowed and closed.unavailable
    assert opened.allowed and not opened.unavailable


def through_failover(
    group: SentinelGroup, settled: Callable[[], bool], asgi: bool, after: int = 0
) -> tuple[list[Any], list[Any], list[Any]]:
    """Decisions of one client under the scope "fenced": 3, then SENTINEL FAILOVER, then one
    every 0.05 s until ``settled()``; with ``after``, that many more one breaker interval
    later. Under ASGI on one loop throughout, so its store (and its connections) lives
    through it."""
    from asgiref.sync import sync_to_async

    from django_throttle import acheck_key, check_key

    async def adecide() -> Any:
        return await acheck_key("fenced", "acme")

    async def abody() -> tuple[list[Any], list[Any], list[Any]]:
        before = [await adecide() for _ in range(3)]
        await sync_to_async(group.failover)()
        during = []
        while not await sync_to_async(settled)():
            during.append(await adecide())
            await asyncio.sleep(0.05)
        if after:
            await asyncio.sleep(INTERVAL + 0.1)
        return before, during, [await adecide() for _ in range(after)]

    def body() -> tuple[list[Any], list[Any], list[Any]]:
        before = [check_key("fenced", "acme") for _ in range(3)]
        group.failover()
        during = []
        while not settled():
            during.append(check_key("fenced", "acme"))
            time.sleep(0.05)
        if after:
            time.sleep(INTERVAL + 0.1)
        return before, during, [check_key("fenced", "acme") for _ in range(after)]

    return run(abody) if asgi else body()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("asgi", [False, True], ids=["wsgi", "asgi"])
def test_with_min_replicas_to_write_a_sentinel_failover_loses_no_count(
    settings: Any, asgi: bool
) -> None:
    """min-replicas-to-write 1 on both data nodes: from the promotion the old primary refuses
    writes (NOREPLICAS), so nothing is counted where the resync would lose it, and a client
    at its limit is admitted no more; the new primary refuses them too until the old one,
    demoted by Sentinel, has linked to it (about 10 s): meanwhile the fail mode answers."""
    with SentinelGroup(service_name=f"svc{next(_groups)}", min_replicas_to_write=1) as group:
        throttle_settings(settings, sentinel_cache(group))  # RULES_REFRESH: one hour
        # Every decision from the store: none from the block cache's memory of a rejection.
        settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "BLOCK_CACHE": False}
        rule("fenced", "fenced", 5, **DECADE, fail_mode="closed", algorithm="fixed_window")
        old = group.master()
        deadline = time.monotonic() + 60

        def settled() -> bool:
            assert time.monotonic() < deadline, "the old primary not demoted and linked"
            new = group.master()
            return new is not old and demoted(old) and not refuses_writes(new.port)

        # ``after``: once the breaker's last refusal is behind.
        before, during, after = through_failover(group, settled, asgi, after=3)
        on_new = counted(group.master())
    assert sum(d.allowed for d in before + during + after) == 5  # the limit, not more
    assert on_new == 5
    assert [d.allowed for d in before] == [True] * 3
    # The switch answered by the fail mode (a decision made in the moment between the new
    # primary taking writes and settled() seeing it may be admitted, and counted there).
    assert during and during[0].unavailable and all(d.allowed or d.unavailable for d in during)
    assert not after[-1].allowed and not after[-1].unavailable  # the new primary's count


def watch_decisions(server: Any) -> None:
    """Have ``server`` log every command it runs (its slow log, with no threshold)."""
    with closing(server.client(socket_timeout=2)) as node:
        node.config_set("slowlog-max-len", 100_000)
        node.config_set("slowlog-log-slower-than", 0)
        node.slowlog_reset()


def decisions_seen(server: Any) -> int:
    """Decisions sent to ``server`` since watch_decisions(), refused ones included."""
    with closing(server.client(socket_timeout=2)) as node:
        entries = node.slowlog_get(100_000)
    return sum(1 for e in entries if e["command"].split()[:2] == [b"EVALSHA", DECIDE_SHA.encode()])


def fence_of(server: Any) -> int:
    with closing(server.client(socket_timeout=2)) as node:
        return int(node.config_get("min-replicas-to-write")["min-replicas-to-write"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("asgi", [False, True], ids=["wsgi", "asgi"])
@pytest.mark.parametrize("refresh", [3600.0, 0.1], ids=["no-refresh", "refreshing"])
def test_with_the_fence_on_the_primary_a_sentinel_failover_loses_no_count_and_refuses_none(
    settings: Any, asgi: bool, refresh: float
) -> None:
    """The fence of docs/deploying.md: min-replicas-to-write 1 on the primary alone. From the
    promotion the old primary refuses writes (NOREPLICAS); the decision it refused finds the
    server promoted from it (INFO replication) and is decided there, before the Sentinels
    name it (and with no rules refresh to hear it from them): no decision follows a fail
    mode, and a client at its limit is admitted no more. Sentinel's reconfig script
    then arms the new primary and disarms the old one, now its replica."""
    with SentinelGroup(service_name=f"svc{next(_groups)}", fenced=True) as group:
        throttle_settings(settings, sentinel_cache(group))
        # Every decision from the store: none from the block cache's memory of a rejection.
        settings.DJANGO_THROTTLE = {
            **settings.DJANGO_THROTTLE,
            "BLOCK_CACHE": False,
            "RULES_REFRESH": refresh,
            "FLUSH_INTERVAL": 3600.0,  # no script of the rejection log's on the old primary
        }
        rule("fenced", "fenced", 5, **DECADE, fail_mode="closed", algorithm="fixed_window")
        old = group.master()
        assert fence_of(old) == 1
        deadline = time.monotonic() + 60

        def settled() -> bool:
            assert time.monotonic() < deadline, "the fence not moved to the new primary"
            new = group.master()
            return new is not old and demoted(old) and fence_of(new) == 1 and fence_of(old) == 0

        watch_decisions(old)
        before, during, _ = through_failover(group, settled, asgi)
        new = group.master()
        on_new = counted(new)
        sent_to_old = decisions_seen(old)
    assert [d.allowed for d in before] == [True] * 3
    assert len(during) > 20  # decided all through the ~10 s until the old primary is demoted
    assert not any(d.unavailable for d in during)  # never the fail mode
    assert [d.allowed for d in during] == [True] * 2 + [False] * (len(during) - 2)
    assert on_new == 5  # the limit, counted where it stays
    # The next decisions go to the promoted server at once: the old primary saw those before
    # the failover and at most the one it refused (none if a refresh moved the process first).
    assert sent_to_old <= len(before) + 1


def replication(address: tuple[str, int]) -> dict[str, Any]:
    """A server's INFO replication, as promoted_replica() asks for it."""
    with closing(redis.Redis(host=address[0], port=address[1], socket_timeout=2)) as node:
        return dict(node.info("replication"))


@contextmanager
def sentinel_pool(group: SentinelGroup) -> Iterator[Any]:
    """redis-py's Sentinel connection pool of the group's primary; its Sentinels closed after."""
    from redis.sentinel import Sentinel

    sentinels = Sentinel(group.sentinels, socket_timeout=2)
    try:
        yield sentinels.master_for(group.service_name).connection_pool
    finally:
        for sentinel in sentinels.sentinels:
            sentinel.close()


def test_only_the_server_promoted_from_a_fenced_primary_is_taken_for_the_new_one() -> None:
    """Between the promotion and the old primary's demotion both servers answer as primaries.
    From the old primary, promoted_replica() finds the promoted one; from the new one (fenced
    in its turn, say), nothing: the old primary was not promoted from it, and a decision
    must never be sent back there."""
    from django_throttle.store.promotion import promoted_replica
    from django_throttle.store.steps import drive

    with SentinelGroup(service_name=f"svc{next(_groups)}") as group, sentinel_pool(group) as pool:
        old = group.master_address()
        new = group.failover()
        assert not demoted(group.server(old[1]))  # a primary still, for about 10 s
        assert drive(promoted_replica(pool, old, replication)) == new
        assert drive(promoted_replica(pool, new, replication)) is None


def test_a_sentinel_switching_between_its_answers_still_finds_the_promoted_server() -> None:
    """promoted_replica() asks the Sentinels for the primary and for its replicas: two
    answers, and the failover's switch can fall between them (seen under load: the primary
    named was still the fenced one, the replicas already only it, and the decision followed
    the fail mode). Here the switch is made to fall between them: the promoted server is
    found all the same."""
    from django_throttle.store.promotion import promoted_replica

    with SentinelGroup(service_name=f"svc{next(_groups)}") as group, sentinel_pool(group) as pool:
        steps = promoted_replica(pool, group.master_address(), replication)
        answers: list[Any] = []
        value: Any = None
        try:
            while True:  # drive()'s loop, with the failover made before the second answer
                call, args = steps.send(value)
                asks_a_sentinel = call is not replication
                if asks_a_sentinel and len(answers) == 1:
                    new = group.failover(everywhere=True)
                value = call(*args)
                if asks_a_sentinel:
                    answers.append(value)
        except StopIteration as done:
            found = done.value
    assert len(answers) == 2  # one answer before the switch, one after
    assert found == new
