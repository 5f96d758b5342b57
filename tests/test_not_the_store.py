"""Faults that are not the store's refuse no decision and open no breaker: the process's own
event loop kept busy while Redis is healthy, and a SCRIPT FLUSH between a NOSCRIPT and the
script's reload; and a probe of a stalled server sends it no decision, so the stall adds at
most one count. Each on every connection kind: the lean asyncio one, redis.asyncio's, and
the sync stack (direct reads and redis-py's)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest

from django_throttle import acheck_key, check_key
from django_throttle.decision import Decision
from django_throttle.store import RedisStore, aio_connection, get_store
from django_throttle.store.aio_connection import LeanConnectionStack
from django_throttle.store.breaker import CLOSED
from tests.helpers import busy_loop, rule, run, window_keys
from tests.redis_server import RedisServer

pytestmark = pytest.mark.django_db

SCOPE = "burst"
BURST = 20


@pytest.fixture(params=["lean", "redis.asyncio"])
def async_kind(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which asyncio stack decides: the lean one, or redis.asyncio's (where hiredis is
    missing, the lean one is not used)."""
    if request.param == "redis.asyncio":
        monkeypatch.setattr(aio_connection, "HIREDIS", False)
    return str(request.param)


@pytest.fixture
def managed(redis_server: RedisServer) -> RedisServer:
    if not redis_server.managed:
        pytest.skip("needs a redis-server the harness runs; unset REDIS_URL")
    return redis_server


def closed_rule(settings: Any, **throttle: Any) -> None:
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, **throttle}
    rule(SCOPE, SCOPE, 1_000_000, unit="day", fail_mode="closed", algorithm="fixed_window")
    check_key(SCOPE, "warm", dry_run=True)  # the rules are loaded before the loop is busy


async def stack_kind() -> str:
    store = await get_store().async_backend()
    stack = store._stack  # type: ignore[union-attr]
    return "lean" if isinstance(stack, LeanConnectionStack) else "redis.asyncio"


def test_a_burst_on_a_busy_loop_is_decided(settings: Any, async_kind: str) -> None:
    """Twenty decisions at once, on a loop that works 50 ms per turn: new connections and
    replies are timed by the store's answer, not by when the loop noticed it."""
    closed_rule(settings, TIMEOUT=0.1, CONNECT_TIMEOUT=0.1)

    async def burst() -> tuple[str, list[Decision]]:
        kind = await stack_kind()
        _, stop = busy_loop()
        try:
            decisions = await asyncio.gather(
                *(acheck_key(SCOPE, f"client:{n}") for n in range(BURST))
            )
            # And again, on the connections the burst made or reused.
            decisions += await asyncio.gather(
                *(acheck_key(SCOPE, f"client:{n}") for n in range(BURST))
            )
        finally:
            stop()
        return kind, decisions

    kind, decisions = run(burst)
    assert kind == async_kind
    assert [d.unavailable for d in decisions] == [False] * 2 * BURST
    assert all(d.allowed for d in decisions)
    assert get_store().breaker.state == CLOSED


def stalled_decisions(server: RedisServer, pause: float) -> list[Decision]:
    """Decisions one after another, before, during and after a SIGSTOP of ``pause`` seconds."""

    async def body() -> list[Decision]:
        decisions = [await acheck_key(SCOPE, "client:1") for _ in range(3)]
        server.pause()
        try:
            ends = time.monotonic() + pause
            while time.monotonic() < ends:
                decisions.append(await acheck_key(SCOPE, "client:1"))
                await asyncio.sleep(0.02)
        finally:
            server.resume()
        return decisions

    return list(run(body))


def test_probes_of_a_stalled_server_send_it_no_decision(
    settings: Any, managed: RedisServer, redis_client: Any, async_kind: str
) -> None:
    """A probe's new connection waits for the server's answer (the handshake, or a PING)
    before its decision: the decisions that timed out are the ones the stall began with."""
    closed_rule(settings, TIMEOUT=0.2, CONNECT_TIMEOUT=0.2, BREAKER_INTERVAL=0.3)
    decisions = stalled_decisions(managed, pause=2.5)
    redis_client.ping()  # after what the server had queued
    time.sleep(0.2)
    redis_client.ping()
    (key,) = window_keys(redis_client)
    counted = int(redis_client.get(key))
    decided = sum(not d.unavailable for d in decisions)
    assert sum(d.unavailable for d in decisions) >= 5  # the breaker probed several times
    assert decided <= counted <= decided + 1


def flushing(server: RedisServer, stop: threading.Event) -> None:
    with closing(server.client(socket_timeout=5)) as client:
        while not stop.is_set():
            client.script_flush()


@pytest.fixture
def script_flushes(redis_server: RedisServer) -> Iterator[None]:
    """SCRIPT FLUSH in a tight loop from another connection, while the test runs."""
    stop = threading.Event()
    thread = threading.Thread(target=flushing, args=(redis_server, stop))
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@pytest.mark.parametrize("reads", ["direct", "redis-py"])
def test_a_script_flush_refuses_no_sync_decision(
    settings: Any, reads: str, redis_server: RedisServer, script_flushes: None
) -> None:
    """NOSCRIPT: the script is loaded and run in one round trip (EVAL), so a SCRIPT FLUSH
    cannot come between its loading and its run."""
    closed_rule(settings, TIMEOUT=1.0)  # a loaded machine's slowness is not what is tested
    if reads == "redis-py":  # health checks: replies read through redis-py's read_response
        client = redis_server.client(socket_timeout=1.0, health_check_interval=30)
        get_store().use(RedisStore(client))
        check_key(SCOPE, "warm", dry_run=True)
    assert get_store().backend()._stack.direct is (reads == "direct")  # type: ignore[attr-defined]
    decisions = [check_key(SCOPE, f"client:{n % 7}") for n in range(600)]
    assert [d.unavailable for d in decisions] == [False] * len(decisions)
    assert get_store().breaker.state == CLOSED


def test_a_script_flush_refuses_no_async_decision(
    settings: Any, async_kind: str, script_flushes: None
) -> None:
    closed_rule(settings, TIMEOUT=1.0)

    async def body() -> tuple[str, list[Decision]]:
        decisions = []
        for n in range(60):
            decisions += await asyncio.gather(
                *(acheck_key(SCOPE, f"client:{k}") for k in range(n % 5 + 1))
            )
        return await stack_kind(), decisions

    kind, decisions = run(body)
    assert kind == async_kind
    assert [d.unavailable for d in decisions] == [False] * len(decisions)
    assert get_store().breaker.state == CLOSED
