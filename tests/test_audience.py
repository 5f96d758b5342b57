"""Who a rule applies to, edited in the admin: everyone, anonymous, authenticated, members of
groups; exemptions for staff, groups, networks (per rule and EXEMPT_NETWORKS). No query per
request once the rules are cached; a user's groups read at most once per refresh period."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError

from django_throttle.models import Rule
from tests.helpers import rule

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

OFFICE, OUTSIDE = "10.1.2.3", "203.0.113.7"


def user(name: str, *, staff: bool = False, groups: tuple[Group, ...] = ()) -> User:
    made = User.objects.create_user(name, password="pw", is_staff=staff)
    made.groups.set(groups)
    return made


def hits(client: Any, times: int, address: str = OUTSIDE) -> list[int]:
    return [client.get("/api/items/", REMOTE_ADDR=address).status_code for _ in range(times)]


def test_anonymous_only_and_authenticated_only(client: Any) -> None:
    rule("anon", "/api/", 1, applies_to="anonymous")
    assert hits(client, 2) == [200, 429]
    client.force_login(user("ann"))
    assert hits(client, 3) == [200, 200, 200]  # not counted once logged in


def test_authenticated_only(client: Any) -> None:
    rule("members", "/api/", 1, applies_to="authenticated", key_kind="user")
    assert hits(client, 3) == [200, 200, 200]
    client.force_login(user("bob"))
    assert hits(client, 2) == [200, 429]


def test_members_of_chosen_groups_only(client: Any) -> None:
    free = Group.objects.create(name="free")
    pro = Group.objects.create(name="pro")
    limited = rule("free-plan", "/api/", 1, applies_to="groups", key_kind="user")
    limited.groups.set([free])
    client.force_login(user("payer", groups=(pro,)))
    assert hits(client, 3) == [200, 200, 200]
    client.force_login(user("freeloader", groups=(free,)))
    assert hits(client, 2) == [200, 429]


def test_staff_and_groups_exempt(client: Any) -> None:
    partners = Group.objects.create(name="partners")
    api = rule("api", "/api/", 1, key_kind="user_or_ip", exempt_staff=True)
    api.exempt_groups.set([partners])
    client.force_login(user("admin", staff=True))
    assert hits(client, 3) == [200, 200, 200]
    client.force_login(user("partner", groups=(partners,)))
    assert hits(client, 3) == [200, 200, 200]
    client.force_login(user("someone"))
    assert hits(client, 2) == [200, 429]


def test_exempt_networks_of_a_rule_and_of_the_setting(client: Any, settings: Any) -> None:
    rule("api", "/api/", 1, exempt_networks="10.0.0.0/8,\n192.168.0.0/16")
    assert hits(client, 3, OFFICE) == [200, 200, 200]
    assert hits(client, 2, OUTSIDE) == [200, 429]
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "EXEMPT_NETWORKS": ["203.0.113.0/24"]}
    rule("again", "/api/", 1)  # a settings change reloads the rules
    assert hits(client, 3, OUTSIDE) == [200, 200, 200]  # exempt from every rule
    assert hits(client, 2, "198.51.100.1") == [200, 429]


def test_an_ipv6_client_is_exempt_by_its_keyed_network(client: Any) -> None:
    rule("api", "/api/", 1, exempt_networks="2001:db8::/32")
    assert hits(client, 3, "2001:db8::7") == [200, 200, 200]
    assert hits(client, 2, "2001:db9::7") == [200, 429]


def test_no_query_per_request_and_groups_read_once_per_refresh(
    client: Any, django_assert_num_queries: Any
) -> None:
    partners = Group.objects.create(name="partners")
    api = rule("api", "/api/", 100, key_kind="user", exempt_staff=True)
    api.exempt_groups.set([partners])
    rule("office", "/api/", 100, exempt_networks="10.0.0.0/8")
    someone = user("someone")
    client.force_login(someone)
    hits(client, 1)  # rules loaded, the user's groups read
    # Per request: Django's own session and user lookups only (2), none for the rules.
    with django_assert_num_queries(2):
        client.get("/api/items/", REMOTE_ADDR=OUTSIDE)
    with django_assert_num_queries(2 * 3):
        hits(client, 3)


@pytest.mark.parametrize("networks", ["10.0.0.0/8, nonsense", "300.1.1.1/8"])
def test_an_invalid_network_is_refused(networks: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Rule(name="r", scope="/api/", limit=5, exempt_networks=networks).full_clean()
    assert "exempt_networks" in refused.value.message_dict


def test_an_invalid_exempt_networks_setting_is_reported(settings: Any) -> None:
    from django_throttle.checks import check_settings

    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "EXEMPT_NETWORKS": ["10.0.0.0/33"]}
    assert [e.id for e in check_settings()] == ["django_throttle.E013"]


def test_changing_a_rule_s_groups_reloads_the_rules(
    client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    partners = Group.objects.create(name="partners")
    api = rule("api", "/api/", 1, key_kind="user")
    client.force_login(user("partner", groups=(partners,)))
    assert hits(client, 2) == [200, 429]
    with django_capture_on_commit_callbacks(execute=True):
        api.exempt_groups.add(partners)
    assert hits(client, 2) == [200, 200]
