"""Client addresses as identities key them: IPv4 as written, IPv6 by its network prefix."""

from __future__ import annotations

import functools
import ipaddress

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
