"""IP addresses as identities key them, and CIDR lists (``exempt_networks``, ``EXEMPT_NETWORKS``)."""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable

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


@functools.lru_cache(maxsize=64)
def cached_networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    """The setting's networks, parsed at the first request that needs them, not at each one."""
    return parse_networks(entries)


@functools.lru_cache(maxsize=4096)
def address_in(address: str, networks: tuple[Network, ...]) -> bool:
    """Whether a client address as keyed (IPv6 as its network) lies in one of ``networks``."""
    try:
        client = ipaddress.ip_network(address, strict=False)
    except ValueError:
        return False
    return any(
        client.version == network.version and client.subnet_of(network)  # type: ignore[arg-type]
        for network in networks
    )
