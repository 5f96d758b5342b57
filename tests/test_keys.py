"""Key kinds through the middleware: who shares a counter with whom."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from django_throttle import reset
from tests.helpers import rule, statuses

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

PROXY = "10.0.0.1"


def from_ip(client: Any, address: str, times: int = 1, **extra: Any) -> list[int]:
    return statuses(client, "/api/items/", times, REMOTE_ADDR=address, **extra)


def via_proxy(client: Any, forwarded: str, times: int = 1) -> list[int]:
    return from_ip(client, PROXY, times, HTTP_X_FORWARDED_FOR=forwarded)


@pytest.fixture
def trusted_proxies(settings: Any, request: Any) -> None:
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "TRUSTED_PROXIES": request.param}


# -- ip -------------------------------------------------------------------------------


def test_ip_key_gives_each_address_its_counter(client: Any) -> None:
    rule("api", "/api/", 1)
    assert from_ip(client, "203.0.113.7", 2) == [200, 429]
    assert from_ip(client, "203.0.113.8", 2) == [200, 429]


def test_ipv6_clients_share_their_64(client: Any) -> None:
    rule("api", "/api/", 1)
    assert from_ip(client, "2001:db8:1:2::1") == [200]
    assert from_ip(client, "2001:db8:1:2::ffff") == [429]
    assert from_ip(client, "2001:db8:1:3::1") == [200]
    # The key is written as the dashboard and reset() show it.
    assert reset("/api/", key="ip:2001:db8:1:2::/64") == 1
    assert from_ip(client, "2001:db8:1:2::abcd") == [200]


def test_ipv6_prefix_setting(client: Any, settings: Any) -> None:
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "IPV6_PREFIX": 48}
    rule("api", "/api/", 1)
    assert from_ip(client, "2001:db8:1:2::1") == [200]
    assert from_ip(client, "2001:db8:1:3::1") == [429]
    assert from_ip(client, "2001:db8:2::1") == [200]


def test_ipv4_mapped_ipv6_is_keyed_as_ipv4(client: Any) -> None:
    rule("api", "/api/", 1)
    assert from_ip(client, "::ffff:203.0.113.7") == [200]
    assert from_ip(client, "203.0.113.7") == [429]


@pytest.mark.parametrize("trusted_proxies", [0], indirect=True)
@pytest.mark.usefixtures("trusted_proxies")
def test_forwarded_for_is_ignored_without_trusted_proxies(client: Any) -> None:
    rule("api", "/api/", 1)
    assert via_proxy(client, "198.51.100.1") == [200]
    assert via_proxy(client, "198.51.100.2") == [429]
    assert from_ip(client, PROXY) == [429]


@pytest.mark.parametrize("trusted_proxies", [1], indirect=True)
@pytest.mark.usefixtures("trusted_proxies")
def test_one_trusted_proxy_right_most_entry_is_the_client(client: Any) -> None:
    rule("api", "/api/", 1)
    assert via_proxy(client, "198.51.100.1") == [200]
    # The client prepends made-up entries; the proxy appends the address it saw.
    assert via_proxy(client, "6.6.6.6, 198.51.100.1") == [429]
    assert via_proxy(client, "198.51.100.2, 198.51.100.1") == [429]
    # Another client behind the same proxy has its own counter.
    assert via_proxy(client, "198.51.100.2") == [200]


@pytest.mark.parametrize("trusted_proxies", [1], indirect=True)
@pytest.mark.usefixtures("trusted_proxies")
@pytest.mark.parametrize(
    "forwarded",
    ["garbage", "198.51.100.1, garbage", "198.51.100.1,", "300.1.1.1", " ", ",,,", "\u00e9"],
)
def test_malformed_forwarded_for_falls_back_to_remote_addr(client: Any, forwarded: str) -> None:
    rule("api", "/api/", 1)
    assert via_proxy(client, forwarded) == [200]
    # Counted under the proxy's own address.
    assert from_ip(client, PROXY) == [429]
    assert via_proxy(client, "198.51.100.1") == [200]


# -- user, user_or_ip --------------------------------------------------------------------


def test_user_key_counts_each_user_and_not_anonymous(client: Any) -> None:
    rule("api", "/api/", 1, key_kind="user")
    assert statuses(client, "/api/items/", 3) == [200, 200, 200]
    client.force_login(User.objects.create_user("alice"))
    assert statuses(client, "/api/items/", 2) == [200, 429]
    client.force_login(User.objects.create_user("bob"))
    assert statuses(client, "/api/items/", 2) == [200, 429]


def test_user_or_ip_key(client: Any) -> None:
    rule("api", "/api/", 1, key_kind="user_or_ip")
    assert statuses(client, "/api/items/", 2) == [200, 429]
    alice = User.objects.create_user("alice")
    client.force_login(alice)
    assert statuses(client, "/api/items/", 2) == [200, 429]
    assert reset("/api/", key=f"user:{alice.pk}") == 1
    assert statuses(client, "/api/items/", 1) == [200]


# -- header, param, global, custom ------------------------------------------------------


def test_header_key(client: Any) -> None:
    rule("api", "/api/", 1, key_kind="header", key_arg="X-Api-Key")
    assert statuses(client, "/api/items/", 2, headers={"X-Api-Key": "k1"}) == [200, 429]
    assert statuses(client, "/api/items/", 1, headers={"X-Api-Key": "k2"}) == [200]
    # A request without the header is not counted by the rule.
    assert statuses(client, "/api/items/", 3) == [200, 200, 200]


def test_param_key_reads_the_form_then_the_query(client: Any) -> None:
    rule("api", "/api/", 1, key_kind="param", key_arg="token")
    assert statuses(client, "/api/items/", 2, data={"token": "a"}) == [200, 429]
    assert statuses(client, "/api/items/", 1, method="post", data={"token": "a"}) == [429]
    assert statuses(client, "/api/items/", 1, method="post", data={"token": "b"}) == [200]
    assert statuses(client, "/api/items/", 1, data={"token": "b"}) == [429]
    # Without the parameter, or with it empty, requests share one counter: never uncounted.
    assert statuses(client, "/api/items/", 2) == [200, 429]
    assert statuses(client, "/api/items/?token=", 1) == [429]


def test_a_forged_query_string_does_not_choose_a_post_s_counter(client: Any) -> None:
    """The view reads the login name from the body; the rule counts by the body too."""
    rule("login", "/login/", 5, key_kind="param", key_arg="username", methods="POST")
    outcomes = [
        client.post(f"/login/?username={query}", {"username": "alice"}).status_code
        for query in ["", "", "x1", "x2", "x3", "x4", "x5", "x6", "", "x7"]
    ]
    assert outcomes.count(429) == 5 and outcomes[:5] == [200] * 5
    # A post whose body has the field empty is counted with the others that have none.
    assert [
        client.post("/login/?username=bob", {"username": ""}).status_code for _ in range(6)
    ] == [200] * 5 + [429]


def test_global_key_is_shared_by_all_clients(client: Any) -> None:
    rule("api", "/api/", 2, key_kind="global")
    assert from_ip(client, "203.0.113.1") == [200]
    assert from_ip(client, "2001:db8::1") == [200]
    assert from_ip(client, "198.51.100.9") == [429]


def test_custom_key_function(client: Any) -> None:
    rule("api", "/api/", 1, key_kind="custom", key_arg="tenant")
    assert statuses(client, "/api/items/", 2, headers={"X-Tenant": "acme"}) == [200, 429]
    assert statuses(client, "/api/items/", 1, headers={"X-Tenant": "globex"}) == [200]
    # The function returns None without the header: the request is not counted.
    assert statuses(client, "/api/items/", 3) == [200, 200, 200]
    assert reset("/api/", key="custom:acme") == 1
    assert statuses(client, "/api/items/", 1, headers={"X-Tenant": "acme"}) == [200]
