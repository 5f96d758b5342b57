"""Store errors never become 500s.

A circuit breaker keeps requests from waiting on a store that just failed; while
it is open, fail-open rules are enforced per process by an in-memory store (the
local fallback, unless LOCAL_FALLBACK is off) and fail-closed rules are
reported unavailable, which the caller answers with 503.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from redis.exceptions import TryAgainError

from .. import metrics
from ..compiled import CompiledRule
from ..conf import conf
from .base import Check, Result, Store
from .breaker import CLOSED, Breaker
from .cluster import AsyncClusterStore
from .errors import STORE_ERRORS
from .memory import MemoryStore
from .redis import AsyncRedisStore

AsyncStore = AsyncRedisStore | AsyncClusterStore


@dataclass(frozen=True, slots=True)
class StoreUnavailable:
    """The store was not used; ``results`` are the local fallback's for the fail-open rules."""

    results: list[Result] | None
    retry_after: float


def fails_closed(rule: CompiledRule) -> bool:
    return rule.fails_closed(conf.FAIL_OPEN)


breaker = Breaker(lambda: conf.BREAKER_INTERVAL)
local_fallback = MemoryStore()


def _unavailable(checks: Sequence[Check], dry_run: bool) -> StoreUnavailable:
    results = None
    if conf.LOCAL_FALLBACK:
        open_checks = [c for c in checks if not fails_closed(c.rule)]
        if open_checks:
            results = local_fallback.decide(open_checks, dry_run)
            for result in results:
                result.local = True  # a refund or a lease's end goes back here
            if not dry_run and metrics.switch.on:
                metrics.fallback_decided(results)
    return StoreUnavailable(results, breaker.retry_after)


def breaker_moved() -> None:
    """Show the breaker's state on the store_available gauge."""
    if metrics.switch.on:
        metrics.store_state(lambda: breaker.state == CLOSED)


def decide_guarded(
    store_of: Callable[[], Store], checks: Sequence[Check], dry_run: bool
) -> list[Result] | StoreUnavailable:
    token = breaker.allow()
    if token is None:
        return _unavailable(checks, dry_run)
    timed = metrics.switch.on
    start = time.perf_counter() if timed else 0.0
    try:
        try:
            results = store_of().decide(checks, dry_run)
        finally:
            if timed:
                metrics.store_timed(time.perf_counter() - start)
    except TryAgainError:
        return _unavailable(checks, dry_run)  # a slot migrating: this request only
    except STORE_ERRORS as exc:
        breaker.failed(exc, token)
        breaker_moved()
        return _unavailable(checks, dry_run)
    except BaseException:
        breaker.abandoned(token)  # interrupted: no verdict on the store, never a stuck probe
        raise
    if breaker.state != CLOSED:  # this call may be the probe that closes the breaker
        breaker.succeeded(token)
        breaker_moved()
    return results


# -- async: a native asyncio Redis client per event loop ------------------------

_async_stores: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, tuple[AsyncStore, AsyncIterator[None]]
] = weakref.WeakKeyDictionary()


async def _close_with_loop(store: AsyncStore) -> AsyncIterator[None]:
    # An async generator left suspended is closed by the loop's shutdown_asyncgens()
    # (asyncio.run, and so asgiref's async_to_sync, call it before closing the loop), so
    # a short-lived loop, as async views under WSGI get, does not leak its connections.
    try:
        yield
    finally:
        await store.aclose()


async def async_store() -> AsyncStore:
    """The running event loop's asyncio store, made on first use, closed with the loop."""
    loop = asyncio.get_running_loop()
    entry = _async_stores.get(loop)
    if entry is None:
        store: AsyncStore = (
            AsyncClusterStore.from_url(conf.CLUSTER_URL)
            if conf.CLUSTER_URL
            else AsyncRedisStore.from_cache(conf.CACHE)
        )
        closer = _close_with_loop(store)
        await closer.__anext__()
        entry = _async_stores[loop] = (store, closer)
    return entry[0]


def reset_fallback() -> None:
    """Forget async clients, the breaker's state and the local fallback's counters, and read
    METRICS again."""
    _async_stores.clear()
    breaker.reset()
    local_fallback.clear()
    metrics.reconfigure()  # a settings change resets the store: METRICS may have changed too
    breaker_moved()


async def adecide_guarded(
    store_of: Callable[[], Store], checks: Sequence[Check], dry_run: bool
) -> list[Result] | StoreUnavailable:
    if not conf.uses_redis:
        return decide_guarded(store_of, checks, dry_run)
    token = breaker.allow()
    if token is None:
        return _unavailable(checks, dry_run)
    timed = metrics.switch.on
    start = time.perf_counter() if timed else 0.0
    try:
        try:
            results = await (await async_store()).decide(checks, dry_run)
        finally:
            if timed:
                metrics.store_timed(time.perf_counter() - start)
    except TryAgainError:
        return _unavailable(checks, dry_run)
    except STORE_ERRORS as exc:
        breaker.failed(exc, token)
        breaker_moved()
        return _unavailable(checks, dry_run)
    except BaseException:
        # CancelledError: the client went away (Django cancels the view) or a timeout
        # cancelled the task while it waited on Redis.
        breaker.abandoned(token)
        raise
    if breaker.state != CLOSED:
        breaker.succeeded(token)
        breaker_moved()
    return results
