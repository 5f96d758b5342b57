"""Where counters live: Redis (shared by every process) or this process's memory."""

from __future__ import annotations

from ..runtime import current
from ..state_keys import digest
from .base import Check, Result, Store, admitted, state_key
from .cluster import ClusterStore
from .fallback import StoreUnavailable
from .guarded import GuardedStore
from .memory import MemoryStore
from .redis import RedisStore

__all__ = (
    "Check",
    "ClusterStore",
    "GuardedStore",
    "MemoryStore",
    "RedisStore",
    "Result",
    "Store",
    "StoreUnavailable",
    "admitted",
    "digest",
    "get_store",
    "state_key",
)


def get_store() -> GuardedStore:
    """The process's store: the current runtime's GuardedStore."""
    return current.runtime.part(GuardedStore)
