"""Store errors never become 500s: fail-open rules fall back to this process's memory,
fail-closed rules are reported unavailable (the caller answers 503)."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from ..conf import conf
from ..rules import CompiledRule
from .base import Check, Result, Store
from .memory import MemoryStore

logger = logging.getLogger("django_throttle")

# Everything a Redis call can raise when the server is down, slow, full, read-only,
# loading, or answers a script error: redis-py wraps all of these in RedisError,
# apart from socket-level OSErrors.
STORE_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError)
RETRY_AFTER_UNAVAILABLE = 1.0


@dataclass(frozen=True, slots=True)
class StoreUnavailable:
    """The store failed; ``results`` are the local fallback's for the fail-open rules."""

    results: list[Result] | None
    retry_after: float


def fails_closed(rule: CompiledRule) -> bool:
    mode = rule.fail_mode
    return mode == "closed" or (mode == "default" and not conf.FAIL_OPEN)


_fallback = MemoryStore()
_outage = False


def _failed(exc: BaseException, checks: Sequence[Check], dry_run: bool) -> StoreUnavailable:
    global _outage
    if not _outage:
        _outage = True
        logger.error("django_throttle: the store is unavailable (%r); applying fail modes", exc)
    open_checks = [c for c in checks if not fails_closed(c.rule)]
    results = _fallback.decide(open_checks, dry_run) if open_checks else None
    return StoreUnavailable(results, RETRY_AFTER_UNAVAILABLE)


def _succeeded() -> None:
    global _outage
    if _outage:
        _outage = False
        logger.warning("django_throttle: the store is reachable again")


def decide_guarded(
    get_store: Callable[[], Store], checks: Sequence[Check], dry_run: bool
) -> list[Result] | StoreUnavailable:
    try:
        results = get_store().decide(checks, dry_run)
    except STORE_ERRORS as exc:
        return _failed(exc, checks, dry_run)
    if _outage:
        _succeeded()
    return results


# -- async: a native asyncio Redis client per event loop ------------------------

_async_stores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
    weakref.WeakKeyDictionary()
)


def _async_store() -> Any:
    from .redis import AsyncRedisStore

    loop = asyncio.get_running_loop()
    store = _async_stores.get(loop)
    if store is None:
        store = _async_stores[loop] = AsyncRedisStore.from_cache(conf.CACHE)
    return store


def reset_async_stores() -> None:
    _async_stores.clear()


async def adecide_guarded(
    checks: Sequence[Check], dry_run: bool
) -> list[Result] | StoreUnavailable:
    if not conf.uses_redis:
        from . import get_store

        return decide_guarded(get_store, checks, dry_run)
    try:
        results = await _async_store().decide(checks, dry_run)
    except STORE_ERRORS as exc:
        return _failed(exc, checks, dry_run)
    if _outage:
        _succeeded()
    return results
