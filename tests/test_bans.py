"""Bans: a banned client is refused (403) by ThrottleMiddleware before any rule, on every path,
with no store call; ip (addresses and networks), user, header and param keys; bans that end;
the 403's three bodies, the dashboard's "ban" and the metric; the Ban admin and the dashboard's
Ban action; a ban made elsewhere in force within RULES_REFRESH. Sync (WSGI) and async."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.utils import timezone
from prometheus_client import REGISTRY

from django_throttle.conf import conf
from django_throttle.models import Ban, Rejection
from django_throttle.rejection_log import flush
from django_throttle.rules import get_rules
from django_throttle.rules.bans import BanIndex
from tests.helpers import rule, run
from tests.test_rule_cache import BUMP_ELSEWHERE, MARGIN, keep_calling, run_elsewhere, wait_for

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

PROBLEM = "application/problem+json"
DETAIL = "Requests from this client are not allowed."
BANNED = "django_throttle_banned_total"
BAN_ADMIN = "/admin/django_throttle/ban/"
KEY_PAGE = "/admin/django_throttle/dashboard/key/"


def banned(kind: str) -> float:
    return REGISTRY.get_sample_value(BANNED, {"kind": kind}) or 0.0


def status(client: Any, path: str = "/plain/", **extra: Any) -> int:
    return int(client.get(path, **extra).status_code)


# -- who is banned -----------------------------------------------------------------------------


def test_an_address_is_refused_on_every_path_and_others_pass(client: Client) -> None:
    Ban.objects.create(key="ip:203.0.113.7", reason="scraper")
    for path in ("/plain/", "/api/items/", "/missing/"):  # no rule covers them; a 404
        assert status(client, path, REMOTE_ADDR="203.0.113.7") == 403
    assert status(client, "/plain/", REMOTE_ADDR="203.0.113.8") == 200
    assert status(client, "/missing/", REMOTE_ADDR="203.0.113.8") == 404


def test_a_ban_comes_before_every_rule_with_no_store_call(client: Client, store_calls: Any) -> None:
    rule("api", "/api/", 1)
    Ban.objects.create(key="ip:203.0.113.7")
    for _ in range(3):
        assert status(client, "/api/items/", REMOTE_ADDR="203.0.113.7") == 403
    assert store_calls.decisions == 0
    assert status(client, "/api/items/", REMOTE_ADDR="203.0.113.8") == 200
    assert store_calls.decisions == 1


@pytest.mark.parametrize(
    ("key", "inside", "outside"),
    [
        ("ip:192.0.2.0/24", ("192.0.2.1", "192.0.2.254"), ("192.0.1.255", "192.0.3.0")),
        ("ip:2001:db8::/48", ("2001:db8::1", "2001:db8:0:ffff::9"), ("2001:db8:1::1", "::1")),
        # One IPv6 address: clients are keyed by their /64, so its /64 is banned.
        ("ip:2001:db8:7:7::1", ("2001:db8:7:7::2",), ("2001:db8:7:8::1",)),
    ],
    ids=["v4-network", "v6-network", "v6-address"],
)
def test_networks_v4_and_v6(client: Client, key: str, inside: Any, outside: Any) -> None:
    Ban.objects.create(key=key)
    for address in inside:
        assert status(client, REMOTE_ADDR=address) == 403, address
    for address in outside:
        assert status(client, REMOTE_ADDR=address) == 200, address


def test_a_user_is_refused_once_logged_in(client: Client) -> None:
    alice = User.objects.create_user("alice")
    bob = User.objects.create_user("bob")
    Ban.objects.create(key=f"user:{alice.pk}")
    assert status(client) == 200  # anonymous
    client.force_login(bob)
    assert status(client) == 200
    client.force_login(alice)
    assert status(client) == 403
    assert status(client, "/missing/") == 403


def test_a_header_ban_reads_the_headers_the_rules_key_on(
    client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    Ban.objects.create(key="header:stolen-key")
    # No rule keys on a header yet: a header ban has no header to read.
    assert status(client, HTTP_X_API_KEY="stolen-key") == 200
    with django_capture_on_commit_callbacks(execute=True):
        rule("by-key", "/api/", 100, key_kind="header", key_arg="X-Api-Key")
    assert status(client, HTTP_X_API_KEY="stolen-key") == 403  # on a path the rule does not cover
    assert status(client, HTTP_X_API_KEY="other-key") == 200
    assert status(client, HTTP_X_OTHER="stolen-key") == 200


def test_a_param_ban_reads_the_parameters_the_rules_key_on(client: Client) -> None:
    rule("by-token", "/api/", 100, key_kind="param", key_arg="token")
    Ban.objects.create(key="param:abc")
    assert status(client, "/plain/?token=abc") == 403
    assert client.post("/plain/", {"token": "abc"}).status_code == 403
    assert status(client, "/plain/?token=abd") == 200
    assert status(client, "/plain/?other=abc") == 200


# -- bans that end -----------------------------------------------------------------------------


def test_an_ended_ban_is_not_applied(client: Client) -> None:
    Ban.objects.create(key="ip:203.0.113.7", expires_at=timezone.now() - timedelta(seconds=1))
    assert status(client, REMOTE_ADDR="203.0.113.7") == 200


def test_a_ban_stops_at_its_end_without_a_reload(client: Client) -> None:
    ends = timezone.now() + timedelta(seconds=1)
    Ban.objects.create(key="ip:203.0.113.7", expires_at=ends)
    Ban.objects.create(key="ip:203.0.113.8")
    assert status(client, REMOTE_ADDR="203.0.113.7") == 403
    loaded = get_rules()
    time.sleep(max(0.0, (ends - timezone.now()).total_seconds()) + 0.05)
    assert status(client, REMOTE_ADDR="203.0.113.7") == 200
    assert status(client, REMOTE_ADDR="203.0.113.8") == 403  # the other one stays
    assert get_rules() is loaded  # the same rules: nothing was read again


def test_the_index_drops_each_ban_at_its_end() -> None:
    index = BanIndex(
        [("ip:203.0.113.0/24", 100.0), ("user:7", 200.0), ("ip:198.51.100.1", None)], now=50.0
    )
    assert "203.0.113.9" in index.current(99.9).networks
    assert index.current(99.9).keys == {"user:7"}
    assert "203.0.113.9" not in index.current(100.0).networks
    assert "198.51.100.1" in index.current(100.0).networks
    assert index.current(150.0).users
    assert not index.current(200.0).users and not index.current(200.0).keys
    assert "198.51.100.1" in index.current(10**12).networks


# -- the answer, the dashboard and the metric -------------------------------------------------


def test_the_403_in_three_bodies(client: Client) -> None:
    Ban.objects.create(key="ip:203.0.113.7")
    html = client.get("/plain/", REMOTE_ADDR="203.0.113.7", HTTP_ACCEPT="text/html")
    assert html.status_code == 403
    assert html["Content-Type"].startswith("text/html")
    assert "<h1>Forbidden</h1>" in html.content.decode()
    assert DETAIL in html.content.decode()
    as_json = client.get("/plain/", REMOTE_ADDR="203.0.113.7", HTTP_ACCEPT="application/json")
    assert (as_json.status_code, as_json["Content-Type"]) == (403, "application/json")
    assert as_json.json() == {"detail": DETAIL}
    problem = client.get("/plain/", REMOTE_ADDR="203.0.113.7", HTTP_ACCEPT=PROBLEM)
    assert (problem.status_code, problem["Content-Type"]) == (403, PROBLEM)
    assert problem.json() == {
        "type": "about:blank",
        "title": "Forbidden",
        "status": 403,
        "detail": DETAIL,
    }
    assert "Retry-After" not in problem


def test_banned_requests_are_logged_as_ban_and_counted(client: Client) -> None:
    alice = User.objects.create_user("alice")
    Ban.objects.create(key="ip:203.0.113.0/24")
    Ban.objects.create(key=f"user:{alice.pk}")
    before_ip, before_user = banned("ip"), banned("user")
    for _ in range(3):
        assert status(client, REMOTE_ADDR="203.0.113.7") == 403
    client.force_login(alice)
    assert status(client, REMOTE_ADDR="198.51.100.1") == 403
    assert (banned("ip"), banned("user")) == (before_ip + 3, before_user + 1)
    flush()
    rows = {
        (r.display, r.action): r.count for r in Rejection.objects.filter(rule="ban").order_by("pk")
    }
    assert rows == {("ip:203.0.113.7", "reject"): 3, (f"user:{alice.pk}", "reject"): 1}


# -- async -------------------------------------------------------------------------------------


def test_async_address_user_and_paths_with_no_rule(async_client: Any) -> None:
    alice = User.objects.create_user("alice")
    Ban.objects.create(key=f"user:{alice.pk}")
    before = banned("user")

    async def body() -> list[int]:
        codes = [(await async_client.get(path)).status_code for path in ("/async/", "/missing/")]
        await async_client.aforce_login(alice)
        codes += [(await async_client.get(path)).status_code for path in ("/async/", "/missing/")]
        return codes

    assert run(body) == [200, 404, 403, 403]
    assert banned("user") == before + 2


def test_async_network_header_and_param(
    async_client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    rule("by-key", "/api/", 100, key_kind="header", key_arg="X-Api-Key")
    rule("by-token", "/api/", 100, key_kind="param", key_arg="token")
    Ban.objects.create(key="header:stolen")
    Ban.objects.create(key="param:abc")

    async def body() -> list[int]:
        return [
            (await async_client.get("/async/", headers={"X-Api-Key": "stolen"})).status_code,
            (await async_client.get("/async/", {"token": "abc"})).status_code,
            (await async_client.get("/async/", {"token": "ok"})).status_code,
        ]

    assert run(body) == [403, 403, 200]
    with django_capture_on_commit_callbacks(execute=True):
        Ban.objects.create(key="ip:127.0.0.0/8")  # AsyncClient's address

    async def problem() -> Any:
        return await async_client.get("/missing/", headers={"Accept": PROBLEM})

    response = run(problem)
    assert (response.status_code, response.json()["type"]) == (403, "about:blank")


# -- in force everywhere within RULES_REFRESH -------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_ban_saved_here_is_announced_and_in_force_at_once(redis_client: Any) -> None:
    from tests.test_rule_cache import version_token

    client = Client()
    assert status(client, REMOTE_ADDR="203.0.113.7") == 200
    before = version_token(redis_client)
    ban = Ban.objects.create(key="ip:203.0.113.7")
    assert version_token(redis_client) != before  # the other processes reload
    assert status(client, REMOTE_ADDR="203.0.113.7") == 403
    before = version_token(redis_client)
    ban.delete()
    assert version_token(redis_client) != before
    assert status(client, REMOTE_ADDR="203.0.113.7") == 200


def test_a_ban_made_in_another_process_is_in_force_within_rules_refresh(client: Client) -> None:
    assert status(client, REMOTE_ADDR="203.0.113.7") == 200
    # Another process's ban reaches the shared database without this process knowing...
    quote = connection.ops.quote_name
    table = quote(Ban._meta.db_table)
    columns = ", ".join(map(quote, ("key", "reason", "created_at", "updated_at")))
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s)",
            ["ip:203.0.113.7", "", now, now],
        )
    # ...and is not in force while the version stays the same.
    for code in keep_calling(lambda: status(client, REMOTE_ADDR="203.0.113.7"), refreshes=2.5):
        assert code == 200
    assert int(run_elsewhere(BUMP_ELSEWHERE)) != os.getpid()  # as that process announces it
    wait_for(lambda: status(client, REMOTE_ADDR="203.0.113.7") == 403, conf.RULES_REFRESH + MARGIN)


# -- the admin ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "error"),
    [
        ("ip:300.1.1.1", "is not an IP address"),
        ("ip:203.0.113.0/33", "is not an IP network"),
        ("ip:2001:db8::/96", "IPv6 clients are told apart by their /64 network"),
        ("host:example.com", "Write the key as the dashboard does"),
        ("user:", "Write the key as the dashboard does"),
        ("203.0.113.7", "Write the key as the dashboard does"),
    ],
)
def test_the_admin_form_refuses_a_bad_key(admin_client: Client, key: str, error: str) -> None:
    response = admin_client.post(BAN_ADMIN + "add/", {"key": key, "reason": ""})
    assert response.status_code == 200
    assert error in response.content.decode()
    assert not Ban.objects.exists()


def test_the_admin_saves_a_key_as_the_index_reads_it(admin_client: Client) -> None:
    for key, kept in (
        ("ip:203.0.113.9/24", "ip:203.0.113.0/24"),
        (" ip:2001:DB8::1 ", "ip:2001:db8::/64"),
        ("ip:198.51.100.1/32", "ip:198.51.100.1"),
        ("header:abc", "header:abc"),
    ):
        response = admin_client.post(BAN_ADMIN + "add/", {"key": key, "reason": "r"})
        assert response.status_code == 302, response.content.decode()
        assert Ban.objects.filter(key=kept).exists()
    again = admin_client.post(BAN_ADMIN + "add/", {"key": "ip:203.0.113.0/24", "reason": ""})
    assert again.status_code == 200 and "already exists" in again.content.decode()


def test_the_admin_lists_searches_and_filters_by_state(admin_client: Client) -> None:
    Ban.objects.create(key="ip:203.0.113.7", reason="scraper")
    Ban.objects.create(key="user:9", expires_at=timezone.now() - timedelta(hours=1))
    Ban.objects.create(key="param:x", expires_at=timezone.now() + timedelta(hours=1))

    def listed(query: str) -> set[str]:
        page = admin_client.get(BAN_ADMIN + query)
        assert page.status_code == 200
        return {b.key for b in page.context["cl"].result_list}

    assert listed("") == {"ip:203.0.113.7", "user:9", "param:x"}
    assert listed("?state=active") == {"ip:203.0.113.7", "param:x"}
    assert listed("?state=expired") == {"user:9"}
    assert listed("?q=scraper") == {"ip:203.0.113.7"}


# -- the dashboard's Ban -----------------------------------------------------------------------


def staff(django_user_model: Any, name: str, *perms: str, csrf: bool = False) -> Client:
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def key_page(client: Client, api_pk: int) -> str:
    return client.get(f"{KEY_PAGE}?rule={api_pk}&key=ip:203.0.113.7").content.decode()


def test_dashboard_ban_takes_the_ban_add_permission(
    django_user_model: Any, django_capture_on_commit_callbacks: Any
) -> None:
    api = rule("api", "/api/", 5)
    ban = {"action": "ban", "key": "ip:203.0.113.7", "expires": "3600", "reason": "abuse"}
    editor = staff(
        django_user_model,
        "editor",
        "django_throttle.view_dashboard",
        "django_throttle.change_rule",
    )
    assert "throttle-block" in key_page(editor, api.pk)
    assert "throttle-ban" not in key_page(editor, api.pk)
    assert editor.post(KEY_PAGE, ban).status_code == 403
    assert not Ban.objects.exists()

    banner = staff(
        django_user_model, "banner", "django_throttle.view_dashboard", "django_throttle.add_ban"
    )
    page = key_page(banner, api.pk)
    assert "throttle-ban" in page and "throttle-block" not in page  # no permission on rules
    with django_capture_on_commit_callbacks(execute=True):
        response = banner.post(KEY_PAGE, ban)
    assert response.status_code == 302
    made = Ban.objects.get()
    assert (made.key, made.reason) == ("ip:203.0.113.7", "abuse")
    assert made.expires_at is not None
    assert timedelta(minutes=59) < made.expires_at - timezone.now() <= timedelta(hours=1)
    entry = LogEntry.objects.get()
    assert (entry.action_flag, entry.object_id) == (ADDITION, str(made.pk))
    assert status(Client(), "/api/items/", REMOTE_ADDR="203.0.113.7") == 403
    # Changing the ban it has takes the change permission, as in the admin.
    assert banner.post(KEY_PAGE, {**ban, "expires": ""}).status_code == 403
    assert Ban.objects.get().expires_at == made.expires_at


def test_dashboard_ban_is_a_csrf_protected_post(django_user_model: Any) -> None:
    banner = staff(
        django_user_model,
        "banner",
        "django_throttle.view_dashboard",
        "django_throttle.add_ban",
        csrf=True,
    )
    response = banner.post(KEY_PAGE, {"action": "ban", "key": "ip:203.0.113.7"})
    assert response.status_code == 403
    assert banner.get(KEY_PAGE + "?action=ban&key=ip:203.0.113.7").status_code == 200
    assert not Ban.objects.exists()


def test_dashboard_ban_of_a_bad_key_is_a_message_not_an_error(admin_client: Client) -> None:
    response = admin_client.post(KEY_PAGE, {"action": "ban", "key": "ip:nonsense"}, follow=True)
    assert response.status_code == 200
    assert "is not an IP address" in response.content.decode()
    assert not Ban.objects.exists()


# -- writes around save() ----------------------------------------------------------------------


def test_bulk_writes_validate_and_normalize_like_save() -> None:
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        Ban.objects.bulk_create([Ban(key="ip:203.0.113.7"), Ban(key="ip:nonsense")])
    assert not Ban.objects.exists()
    Ban.objects.bulk_create([Ban(key="ip:2001:db8::5")])
    assert Ban.objects.get().key == "ip:2001:db8::/64"
    with pytest.raises(ValidationError):
        Ban.objects.update(key="user:")
    assert Ban.objects.get().key == "ip:2001:db8::/64"


def test_without_redis_the_version_moves_with_every_ban_write() -> None:
    from django_throttle.rules import DatabaseVersion

    version = DatabaseVersion()
    seen = [version.read()]
    ban = Ban.objects.create(key="ip:203.0.113.7")
    seen.append(version.read())
    ban.expires_at = timezone.now() + timedelta(hours=1)
    ban.save()
    seen.append(version.read())
    ban.delete()
    seen.append(version.read())
    assert len(set(seen[1:])) == 3 and seen[1] != seen[0]
