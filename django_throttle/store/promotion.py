"""The primary a Sentinel failover promoted, found before the Sentinels name it.

With the fence of docs/deploying.md ("Counts across a failover": ``min-replicas-to-write`` on
the primary), the old primary refuses every write with ``NOREPLICAS`` from the moment a
replica is promoted, so no decision counts where the resync would lose it. The Sentinels
name the new primary about 0.6 s later: meanwhile a decision refused that way looks for the
server promoted from the one that refused it (``INFO replication``: a primary whose former
replication id, ``master_replid2``, is the refusing primary's id) and goes there instead of
following its fail mode. Nothing else qualifies: not the old primary seen again before
Sentinel demotes it, nor a replica detached by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import STORE_ERRORS
from .steps import Steps

Address = tuple[Any, Any]  # (host, port), as redis-py's Sentinel pools give them


def replication_fields(reply: Any) -> dict[str, str]:
    """The fields of an ``INFO replication`` reply (bytes or str)."""
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
    fields = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in fields}


def promoted_replica(
    pool: Any, fenced: Address | None, replication: Callable[[Address], Any]
) -> Steps[Address | None]:
    """For a Sentinel pool (redis-py's, driven by drive(); redis.asyncio's, by adrive()) whose
    primary ``fenced`` refused a write with NOREPLICAS: the server the Sentinels name, or one
    of their replicas, that was promoted from it; None if none was (a replica lost, no
    failover: the fail mode answers), or if no Sentinel or server can be asked.
    ``replication``: a server's ``INFO replication`` fields (replication_fields())."""
    if fenced is None:
        return None
    fenced = tuple(fenced)
    try:
        lineage = (yield replication, (fenced,)).get("master_replid")
        if not lineage:
            return None
        # The replicas before the primary: a Sentinel that switches to the promoted server
        # between the two answers names it in one or the other. The other way round, both
        # can miss it: the primary named still the fenced one, the replicas already only it.
        replicas = yield pool.sentinel_manager.discover_slaves, (pool.service_name,)
        named = yield pool.get_master_address, ()
        for candidate in (named, *replicas):
            address = tuple(candidate)
            if address == fenced:
                continue
            fields = yield replication, (address,)
            if fields.get("role") == "master" and fields.get("master_replid2") == lineage:
                return address
    except STORE_ERRORS:
        return None
    return None


class Promotion:
    """Where a stack's decisions go while the Sentinels still name a fenced primary: the
    replica found promoted, until they name any other primary (then theirs again). One
    tuple, replaced whole, so threads sharing a stack read a consistent pair."""

    __slots__ = ("pair",)

    def __init__(self) -> None:
        self.pair: tuple[Address, Address] | None = None  # (fenced, promoted)

    def instead_of(self, named: Any) -> Address | None:
        """The promoted server to decide on instead of ``named``, the primary the Sentinels
        name (None: not heard yet); None once they name any other."""
        pair = self.pair
        if pair is None:
            return None
        if named is None or tuple(named) == pair[0]:
            return pair[1]
        self.pair = None  # the Sentinels name the new primary now
        return None

    def primary(self, named: Any) -> Any:
        """Where decisions go: the promoted server instead of ``named`` (instead_of()), else
        ``named`` itself."""
        return self.instead_of(named) or named

    def found(self, fenced: Address, address: Address) -> None:
        """``address`` was promoted from ``fenced``, the primary that refused a write."""
        self.pair = (tuple(fenced), address)
