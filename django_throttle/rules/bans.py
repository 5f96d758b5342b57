"""``BanIndex``: the bans in force, built when the rules load, looked up with no store call."""

from __future__ import annotations

import ipaddress
import logging
import math
import threading
from collections.abc import Iterable
from typing import NamedTuple

from ..networks import Network, NetworkSet

logger = logging.getLogger("django_throttle")

# A ban's key and when it ends (a Unix time; None: never).
BanRow = tuple[str, float | None]


class _Lookup(NamedTuple):
    """What a request is looked up in, replaced whole when a ban ends."""

    networks: NetworkSet  # ip: bans, addresses and networks alike
    keys: frozenset[str]  # user:, header: and param: bans, as identities write them
    users: bool
    header_keys: tuple[str, ...]  # request.META names to read: only with header bans
    params: tuple[str, ...]  # parameter names to read: only with param bans
    ends: float  # the first time a ban in force ends (inf: none does)


class BanIndex:
    """The bans in force. An address is looked up as exempt networks are (a bisect, whatever
    their number), other keys in a set; a ban that ends is dropped at its first lookup after
    that, without a reload."""

    __slots__ = ("_header_keys", "_ipv6_prefix", "_lock", "_lookup", "_params", "_rows")

    def __init__(
        self,
        rows: Iterable[BanRow] = (),
        header_keys: Iterable[str] = (),
        params: Iterable[str] = (),
        ipv6_prefix: int = 64,
        now: float = 0.0,
    ) -> None:
        self._rows = tuple(rows)
        self._header_keys = tuple(sorted(set(header_keys)))
        self._params = tuple(sorted(set(params)))
        self._ipv6_prefix = ipv6_prefix
        self._lock = threading.Lock()
        self._lookup = self._build(now)

    def _build(self, now: float) -> _Lookup:
        networks: list[Network] = []
        keys: set[str] = set()
        ends = math.inf
        for key, until in self._rows:
            if until is not None:
                if until <= now:
                    continue
                ends = min(ends, until)
            if key.startswith("ip:"):
                try:
                    networks.append(ipaddress.ip_network(key[3:], strict=False))
                except ValueError:  # written behind the model's back
                    logger.error("django_throttle: the ban of %r is not an address; skipped", key)
            else:
                keys.add(key)
        return _Lookup(
            NetworkSet(networks, self._ipv6_prefix),
            frozenset(keys),
            any(key.startswith("user:") for key in keys),
            self._header_keys if any(key.startswith("header:") for key in keys) else (),
            self._params if any(key.startswith("param:") for key in keys) else (),
            ends,
        )

    def current(self, now: float) -> _Lookup:
        """What to look a request up in at ``now`` (a Unix time)."""
        lookup = self._lookup
        if now < lookup.ends:
            return lookup
        with self._lock:  # one thread drops what ended; the others wait for it, briefly
            if now >= self._lookup.ends:
                self._lookup = self._build(now)
            return self._lookup

    def __bool__(self) -> bool:
        return bool(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return f"BanIndex({len(self._rows)} bans)"
