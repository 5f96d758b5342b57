"""Exempt networks (a rule's and EXEMPT_NETWORKS): the same answers as "the client's keyed
address or network is a subnet of one listed", and a lookup whose work does not grow with the
number of networks listed."""

from __future__ import annotations

import ipaddress
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import pytest

from django_throttle.models import Rule
from django_throttle.networks import NetworkSet, normalized, parse_networks
from tests.helpers import rule

MANY = 100_000


def many_networks(count: int) -> list[str]:
    """``count`` /30s spread over 100.0.0.0/8 (none of them holds 10.x or 203.0.113.x)."""
    return [str(ipaddress.IPv4Network((0x64000000 + 8 * i, 30))) for i in range(count)]


def reference(address: str, networks: list[str]) -> bool:
    """What exempt networks have always meant: the keyed address or network lies in one."""
    try:
        client = ipaddress.ip_network(address, strict=False)
    except ValueError:
        return False
    return any(
        client.version == network.version and client.subnet_of(network)  # type: ignore[arg-type]
        for network in parse_networks(networks)
    )


def random_network(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return str(
            ipaddress.IPv4Network(
                (rng.choice([0x0A000000, 0xCB007100]) + rng.getrandbits(12), rng.randint(8, 32)),
                strict=False,
            )
        )
    base = 0x20010DB8 << 96 | rng.getrandbits(20) << 64 | rng.getrandbits(4)
    return str(ipaddress.IPv6Network((base, rng.randint(32, 128)), strict=False))


def random_address(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.4:
        return str(
            ipaddress.IPv4Address(rng.choice([0x0A000000, 0xCB007100]) + rng.getrandbits(12))
        )
    if kind < 0.5:  # IPv4-mapped IPv6: keyed as the IPv4 address
        return "::ffff:" + str(ipaddress.IPv4Address(0x0A000000 + rng.getrandbits(12)))
    return str(
        ipaddress.IPv6Address(0x20010DB8 << 96 | rng.getrandbits(20) << 64 | rng.getrandbits(4))
    )


@pytest.mark.parametrize("ipv6_prefix", [64, 48, 128])
def test_lookups_answer_as_the_subnet_test_does(ipv6_prefix: int) -> None:
    rng = random.Random(ipv6_prefix)
    for _ in range(200):
        listed = [random_network(rng) for _ in range(rng.randint(1, 30))]
        networks = NetworkSet(parse_networks(listed), ipv6_prefix)
        for _ in range(30):
            address = normalized(random_address(rng), ipv6_prefix) or "unknown"
            assert (address in networks) == reference(address, listed), (address, listed)


def test_adjacent_longer_networks_do_not_exempt_an_ipv6_client_they_cover_together() -> None:
    # The two halves of a /64 hold all of it, but neither holds the client's network.
    halves = ["2001:db8:1:2::/65", "2001:db8:1:2:8000::/65"]
    address = normalized("2001:db8:1:2::7", 64)
    assert address == "2001:db8:1:2::/64"
    assert address not in NetworkSet(parse_networks(halves), 64)
    assert address in NetworkSet(parse_networks(["2001:db8:1::/48"]), 64)


def test_an_ipv4_mapped_client_is_exempt_by_its_ipv4_network_only() -> None:
    address = normalized("::ffff:10.1.2.3", 64)
    assert address == "10.1.2.3"
    assert address in NetworkSet(parse_networks(["10.0.0.0/8"]), 64)
    assert address not in NetworkSet(parse_networks(["::ffff:10.0.0.0/104"]), 64)


def test_merged_ranges_keep_their_edges() -> None:
    networks = NetworkSet(parse_networks(["10.0.0.0/24", "10.0.1.0/24", "10.0.0.128/25"]), 64)
    assert "10.0.0.0" in networks and "10.0.1.255" in networks
    assert "9.255.255.255" not in networks and "10.0.2.0" not in networks
    assert "unknown" not in networks and "" not in networks


@contextmanager
def calls_into(*files: str) -> Iterator[list[int]]:
    """Count the Python-level calls made to functions defined in ``files``."""
    counted = [0]

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.endswith(files):
            counted[0] += 1

    sys.setprofile(profile)
    try:
        yield counted
    finally:
        sys.setprofile(None)


def work_per_request(client: Any, address: str) -> int:
    with calls_into("ipaddress.py", "networks.py") as counted:
        assert client.get("/api/items/", REMOTE_ADDR=address).status_code == 200
    return counted[0]


@pytest.mark.django_db
@pytest.mark.usefixtures("throttle_middleware")
def test_a_request_does_the_same_work_with_100000_networks_as_with_2(
    client: Any, settings: Any
) -> None:
    work: dict[int, tuple[int, int]] = {}
    for count in (2, MANY):
        listed = many_networks(count)
        settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "EXEMPT_NETWORKS": listed}
        Rule.objects.all().delete()
        rule(f"api{count}", "/api/", 2, exempt_networks="\n".join(listed))
        client.get("/api/items/", REMOTE_ADDR="100.0.0.1")  # rules and sets built
        known = "203.0.113.7"
        client.get("/api/items/", REMOTE_ADDR=known)
        # A client seen before, then one never seen (its address parsed once).
        work[count] = (
            work_per_request(client, known),
            work_per_request(client, f"203.0.113.{count % 250 + 1}"),
        )
        exempt = [client.get("/api/items/", REMOTE_ADDR="100.0.0.1").status_code for _ in "ab"]
        assert exempt == [200, 200]  # its third request of a rule of 2
    assert work[MANY] == work[2]
    assert work[MANY][1] < 100  # parsing one address, not a test per network


@pytest.mark.parametrize(
    "text",
    ["203.0.113.7", "0.0.0.0", "255.255.255.255", "01.2.3.4", "1.2.3", "1.2.3.4.5", "256.1.1.1"]
    + ["1.2.3.04", "1.2.3.4 ", " 1.2.3.4:80", "0x1.2.3.4", "1e1.2.3.4", "::ffff:1.2.3.4"],
)
def test_an_ipv4_address_is_read_as_ipaddress_reads_it(text: str) -> None:
    import ipaddress

    stripped = text.strip().split(":", 1)[0] if text.strip().count(":") == 1 else text.strip()
    try:
        parsed = ipaddress.ip_address(stripped)
    except ValueError:
        expected = None
    else:
        mapped = getattr(parsed, "ipv4_mapped", None)
        expected = str(mapped or parsed)
    assert normalized.__wrapped__(text, 64) == expected
