"""IP addresses as identities key them, and CIDR lists (``exempt_networks``, ``EXEMPT_NETWORKS``)."""

from __future__ import annotations

import bisect
import functools
import ipaddress
import re
import socket
from collections.abc import Iterable, Iterator

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_ADDRESS_CHARS = 100  # an IPv6 address with brackets, zone id and port is well under this


@functools.lru_cache(maxsize=4096)  # clients come back: parse each address once, not per request
def normalized(text: str, ipv6_prefix: int) -> str | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[2001:db8::1]:443"
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "203.0.113.7:51234"
        text = text.split(":", 1)[0]
    text = text.split("%", 1)[0]  # a zone id ("fe80::1%eth0") names a local interface
    try:
        # A dotted quad inet_pton reads is one ipaddress reads and spells the same (four
        # decimal octets, no leading zeros), in a tenth of the time: a new client pays less.
        socket.inet_pton(socket.AF_INET, text)
        return text
    except (OSError, ValueError):
        pass
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if address.version == 6:
        mapped = address.ipv4_mapped
        if mapped is not None:
            return str(mapped)
        network = ipaddress.IPv6Network((address, ipv6_prefix), strict=False)
        return str(network)
    return str(address)


_SEPARATORS = re.compile(r"[\s,]+")


def parse_networks(text: str | Iterable[str]) -> tuple[Network, ...]:
    """``"10.0.0.0/8, 2001:db8::/32"`` (or a list of them) as networks; raise ValueError naming
    the first entry that is not one."""
    entries = _SEPARATORS.split(text) if isinstance(text, str) else list(text)
    networks = []
    for entry in entries:
        entry = str(entry).strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not an IP network (write e.g. 10.0.0.0/8)") from None
    return tuple(networks)


def canonical_networks(text: str) -> str:
    """A CIDR list as a rule keeps it and a rule file writes it: each network in its own
    spelling (host bits cleared, IPv6 compressed in lower case), comma-separated; raise
    ValueError as parse_networks() does."""
    return ", ".join(str(network) for network in parse_networks(text))


class NetworkSet:
    """CIDRs as merged ranges of integer addresses per IP version and client prefix length:
    whether a client lies in them is a bisect, whatever their number."""

    __slots__ = ("_hash", "_ranges", "networks")

    def __init__(self, networks: Iterable[Network] = (), ipv6_prefix: int = 64) -> None:
        self.networks = tuple(networks)
        self._hash: int | None = None
        # (version, the client's prefix length) -> (starts, ends), built for the lengths clients
        # are keyed by when the rules load, and for any other at its first client.
        self._ranges: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        if self.networks:
            self._build(4, 32)
            self._build(6, ipv6_prefix)

    def _build(self, version: int, prefix: int) -> tuple[list[int], list[int]]:
        # A client's network lies in a listed one only if that one is no longer than its own
        # prefix: CIDR blocks are nested or apart, so longer ones never each hold the client,
        # even when together they cover it.
        spans = sorted(
            (int(n.network_address), int(n.broadcast_address))
            for n in self.networks
            if n.version == version and n.prefixlen <= prefix
        )
        starts: list[int] = []
        ends: list[int] = []
        for first, last in spans:
            if ends and first <= ends[-1] + 1:
                ends[-1] = max(ends[-1], last)
            else:
                starts.append(first)
                ends.append(last)
        self._ranges[version, prefix] = (starts, ends)
        return starts, ends

    def __contains__(self, address: object) -> bool:
        """Whether a client address as keyed (IPv6 as its network) lies in one of the networks."""
        if not self.networks or not isinstance(address, str):
            return False
        if ":" not in address:
            # A dotted quad, as normalized() writes IPv4: read in a tenth of a microsecond,
            # less than a cache of them costs a client it has not seen (bans, docs/bounds.md).
            try:
                first = _from_bytes(socket.inet_pton(socket.AF_INET, address), "big")
            except OSError:
                return False
            version, prefix = 4, 32
        else:
            span = _span(address)
            if span is None:
                return False
            version, first, prefix = span
        ranges = self._ranges.get((version, prefix))
        if ranges is None:
            ranges = self._build(version, prefix)
        starts, ends = ranges
        at = bisect.bisect_right(starts, first) - 1
        return at >= 0 and first <= ends[at]

    def __bool__(self) -> bool:
        return bool(self.networks)

    def __len__(self) -> int:
        return len(self.networks)

    def __iter__(self) -> Iterator[Network]:
        return iter(self.networks)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NetworkSet):
            return self.networks == other.networks
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:  # a compiled rule's hash would otherwise walk every network
            self._hash = hash(self.networks)
        return self._hash

    def __repr__(self) -> str:
        return f"NetworkSet({len(self.networks)} networks)"


NO_NETWORKS = NetworkSet()
_from_bytes = int.from_bytes


@functools.lru_cache(maxsize=4096)  # clients come back: read each address once, not per request
def _span(address: str) -> tuple[int, int, int] | None:
    """A keyed IPv6 address (its network) as (IP version, first address as an integer, prefix
    length)."""
    # normalized() wrote it, in canonical form: inet_pton reads it in a fraction of the time
    # ipaddress takes.
    text, _, prefix = address.partition("/")
    try:
        length = int(prefix) if prefix else 128
        return 6, _from_bytes(socket.inet_pton(socket.AF_INET6, text), "big"), length
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=64)  # rules that list the same networks share one set
def network_set(text: str | tuple[str, ...], ipv6_prefix: int) -> NetworkSet:
    """A rule's ``exempt_networks`` or the ``EXEMPT_NETWORKS`` setting, ready for lookups;
    raise ValueError as parse_networks() does."""
    return NetworkSet(parse_networks(text), ipv6_prefix)
