"""Small helpers shared by the enforcement tests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import async_to_sync

from django_throttle.models import Rule


def rule(name: str, scope: str, limit: int, **fields: Any) -> Rule:
    """An enabled admin rule (defaults: per ip, per minute, sliding window counter, reject)."""
    return Rule.objects.create(name=name, scope=scope, limit=limit, **fields)


def clear_of_window_end(period: int, margin: float) -> None:
    """Wait, if fewer than ``margin`` seconds are left of the clock's ``period`` (windows and
    the rejection log's minutes start at multiples of their length since the epoch; Redis
    tells the time of this host's clock), until the next one starts: a test that counts in
    one window must not see it end halfway."""
    left = period - time.time() % period
    if left < margin:
        time.sleep(left + 0.01)


def room_in_the_minute() -> None:
    """At least 10 s of the clock's minute left."""
    clear_of_window_end(60, 10)


def away_from_midnight() -> None:
    """Every request of the test in one day window (UTC days, the rules' windows)."""
    clear_of_window_end(86400, 120)


# A fixed window that no test outlasts: ten years (the longest a rule may have), from the
# epoch's multiples of it, so the one in force ends in February 2030. DECADE: a Rule's fields.
DECADE_SECONDS = 3660 * 86400
DECADE = {"unit": "day", "per": DECADE_SECONDS // 86400}


def statuses(client: Any, path: str, times: int, method: str = "get", **extra: Any) -> list[int]:
    """The status codes of `times` identical requests."""
    return [getattr(client, method)(path, **extra).status_code for _ in range(times)]


def window_keys(redis_client: Any) -> list[bytes]:
    """The keys of fixed windows and sliding window counters in Redis: ``<state key>:<window>``
    (a state key ends with its client's ``{tag}``), not the rejection log's or the rules'."""
    return [
        key
        for key in redis_client.keys("thr:*}:*")
        if key.rsplit(b":", 1)[1].isdigit() and not key.startswith(b"thr:rej")
    ]


BUSY = 0.05  # seconds of synchronous work per turn of the loop: other requests' views


def busy_loop() -> tuple[asyncio.AbstractEventLoop, Callable[[], None]]:
    """Keep the running loop busy: a callback that works synchronously for BUSY seconds each
    turn, as views and middleware of other requests do. Returns the function that stops it."""
    loop = asyncio.get_running_loop()
    running = [True]

    def work() -> None:
        time.sleep(BUSY)
        if running[0]:
            loop.call_soon(work)

    loop.call_soon(work)
    return loop, lambda: running.__setitem__(0, False)


def run(make_coroutine: Callable[[], Awaitable[Any]]) -> Any:
    """Run an async test body in a fresh event loop, as an async view under WSGI runs;
    Django's sync_to_async calls come back to this thread, so the test database (one
    connection per thread) is the same. The loop's Redis client must be closed with the
    loop by django_throttle itself: an unclosed socket would warn (an error here)."""

    async def body() -> Any:
        return await make_coroutine()

    return async_to_sync(body)()


def where_gathered(monkeypatch: Any) -> tuple[list[str], list[int]]:
    """Record where each gathering runs: "loop" on a thread listed in the second list (the
    test's event loop adds its own), else "thread"."""
    from django_throttle.engine import pipeline

    places: list[str] = []
    loop: list[int] = []
    gather = pipeline.gather

    def recorded(*args: Any, **kwargs: Any) -> Any:
        result = gather(*args, **kwargs)
        places.append("loop" if threading.get_ident() in loop else "thread")
        return result

    monkeypatch.setattr(pipeline, "gather", recorded)
    return places, loop
