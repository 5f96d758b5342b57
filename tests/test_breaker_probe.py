"""The circuit breaker's probe can never stick: whatever ends it (an error, a timeout, a
cancelled task, a vanished thread) frees it, so limiting in Redis resumes by itself."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.handlers.asgi import ASGIHandler

from django_throttle.store import get_store
from django_throttle.store.breaker import CLOSED, OPEN, PROBING, Breaker
from django_throttle.store.fallback import allow
from tests.helpers import rule, run, window_keys
from tests.redis_server import RedisServer
from tests.traffic import asgi_get, database_kept_open

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

INTERVAL = 0.2  # BREAKER_INTERVAL
TIMEOUT = 1.0  # the decision timeout: the probe is still waiting on the paused server at 0.3 s
PATH = "/users/1/"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_probe_that_never_reports_is_replaced_after_one_interval() -> None:
    clock = Clock()
    b = Breaker(lambda: 5.0, clock)
    b.failed(OSError("down"), b.allow() or 0)
    clock.now += 5.0
    lost = b.allow()
    assert lost is not None and b.state == PROBING  # the probe's thread then vanishes
    clock.now += 4.9
    assert b.allow() is None  # still the probe's turn
    clock.now += 0.1
    probe = b.allow()
    assert probe is not None and b.state == PROBING  # another request probes
    b.succeeded(lost)  # the lost one reports at last: not the probe any more
    assert b.state == PROBING
    b.succeeded(probe)
    assert b.state == CLOSED


def test_an_abandoned_probe_lets_the_next_request_probe_at_once() -> None:
    clock = Clock()
    b = Breaker(lambda: 5.0, clock)
    b.failed(OSError("down"), b.allow() or 0)
    clock.now += 5.0
    probe = b.allow()
    assert probe is not None
    assert b.allow() is None
    b.abandoned(probe)
    assert b.state == OPEN
    assert b.allow() is not None and b.state == PROBING  # no new interval to wait


def test_abandoned_does_not_reopen_a_closed_breaker() -> None:
    b = Breaker(lambda: 5.0, Clock())
    b.abandoned(b.allow() or 0)
    assert b.state == CLOSED and b.allow() is not None


def test_a_call_from_before_the_recovery_does_not_reopen_it() -> None:
    """A call sent before the store failed, whose timeout comes after the probe succeeded,
    says nothing about the store now; nor does a late success close an open breaker."""
    clock = Clock()
    b = Breaker(lambda: 5.0, clock)
    early, late = b.allow(), b.allow()
    assert early is not None and late is not None
    b.failed(OSError("down"), early)
    b.succeeded(late)  # began before the failure, ended after it
    assert b.state == OPEN
    clock.now += 5.0
    probe = b.allow()
    assert probe is not None
    b.succeeded(probe)
    assert b.state == CLOSED
    b.failed(TimeoutError("late"), late)
    assert b.state == CLOSED and b.allow() is not None


@pytest.fixture
def asgi_app() -> Iterator[ASGIHandler]:
    with database_kept_open():
        yield ASGIHandler()


@pytest.mark.parametrize("cancel_after", [0.0, 0.002, 0.02, 0.3])
def test_a_cancelled_probe_under_asgi_frees_the_breaker(
    settings: Any,
    redis_server: RedisServer,
    redis_client: Any,
    asgi_app: ASGIHandler,
    cancel_after: float,
) -> None:
    """The probe request's client disconnects while the probe waits on Redis (connecting,
    handshaking, waiting for the reply): the next request probes, and limiting resumes."""
    if not redis_server.managed:
        pytest.skip("needs a redis-server the harness runs; unset REDIS_URL")
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "TIMEOUT": TIMEOUT,
        "CONNECT_TIMEOUT": TIMEOUT,
        "BREAKER_INTERVAL": INTERVAL,
    }
    rule("closed", r"^/users/\d+/$", 3, fail_mode="closed", algorithm="fixed_window")
    app = asgi_app

    async def body() -> list[Any]:
        statuses = [(await asgi_get(app, PATH))[0]]  # connected, script loaded
        redis_server.pause()
        try:
            statuses.append((await asgi_get(app, PATH))[0])  # times out: the breaker opens
            assert get_store().breaker.state == OPEN
            await asyncio.sleep(INTERVAL)
            statuses.append((await asgi_get(app, PATH, disconnect_after=cancel_after))[0])
            assert get_store().breaker.state != PROBING
        finally:
            redis_server.resume()
        # Requests that timed out reach Redis when it resumes (and may be counted there): let
        # them run, then count from zero.
        redis_client.ping()
        redis_client.flushdb()
        # No interval to wait: the next request is a probe and succeeds.
        statuses += [(await asgi_get(app, PATH))[0] for _ in range(4)]
        return statuses

    statuses = run(body)
    assert statuses[:2] == [200, 503]
    assert statuses[2] is None  # the client went away: no response
    assert statuses[3:] == [200, 200, 200, 429]  # 3 per window, counted in Redis again
    assert get_store().breaker.state == CLOSED
    counts = [redis_client.get(k) for k in window_keys(redis_client)]
    assert counts == [b"3"]  # the three admitted requests


def test_the_groups_of_one_recovering_master_share_its_probe() -> None:
    """A request with two slot groups on one master whose breaker is due a probe: both groups
    go with the probe, rather than the second finding it taken and failing."""
    now = [0.0]
    master = Breaker(lambda: 1.0, clock=lambda: now[0], node="10.0.0.1:7000")
    other = Breaker(lambda: 1.0, clock=lambda: now[0], node="10.0.0.2:7000")
    master.failed(ConnectionError("down"), master.allow())  # type: ignore[arg-type]
    now[0] = 2.0  # the interval is over: the next call probes
    tokens = allow([master, master, other])
    assert tokens[0] is not None and tokens[0] == tokens[1]
    assert tokens[2] is not None
    assert master.state == PROBING
