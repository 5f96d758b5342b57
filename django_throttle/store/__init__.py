"""Where counters live: Redis (shared by every process) or this process's memory."""

from __future__ import annotations

import threading

from ..conf import conf
from ..keyspace import digest
from .base import Check, Result, Store, admitted, state_key
from .cluster import ClusterStore
from .fallback import reset_fallback
from .memory import MemoryStore
from .redis import RedisStore

__all__ = [
    "Check",
    "ClusterStore",
    "MemoryStore",
    "RedisStore",
    "Result",
    "Store",
    "admitted",
    "digest",
    "get_store",
    "reset_store",
    "state_key",
]

_store: Store | None = None
_lock = threading.Lock()


def get_store() -> Store:
    """The process's store, built once from the settings."""
    global _store
    store = _store
    if store is None:
        with _lock:
            if _store is None:
                _store = _build()
            store = _store
    return store


def _build() -> Store:
    if not conf.uses_redis:
        return MemoryStore()
    if conf.CLUSTER_URL:
        return ClusterStore.from_url(conf.CLUSTER_URL)
    return RedisStore.from_cache(conf.CACHE)


def reset_store() -> None:
    """Build the store anew at next use, with a closed breaker and an empty fallback."""
    global _store
    with _lock:
        old, _store = _store, None
    close = getattr(old, "close", None)
    if close is not None:
        close()
    reset_fallback()
