"""The admin dashboard: figures, filters, permissions, key inspection and reset."""

from __future__ import annotations

import re
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.test import Client, RequestFactory
from django.utils import timezone

from django_throttle import check
from django_throttle.models import Rejection, Rule
from django_throttle.rejection_log import flush, rejection_log
from django_throttle.store import digest
from tests.helpers import rule

pytestmark = [pytest.mark.db_matters, pytest.mark.django_db]

DASHBOARD = "/admin/django_throttle/dashboard/"
DATA = DASHBOARD + "data/"
KEY = DASHBOARD + "key/"
RULES = "/admin/django_throttle/rule/"
CLIENT_IP = "203.0.113.7"


def reject(scope: str, ip: str = CLIENT_IP, times: int = 1) -> None:
    """Requests from ip until `times` of them were rejected under scope."""
    request = partial(RequestFactory().post, "/", REMOTE_ADDR=ip)
    rejected = 0
    for _ in range(100):
        rejected += not check(request(), scope).allowed
        if rejected == times:
            return
    raise AssertionError(f"{scope} did not reject {ip} {times} times")


def remaining(scope: str, ip: str = CLIENT_IP) -> int | None:
    return check(RequestFactory().post("/", REMOTE_ADDR=ip), scope, dry_run=True).remaining


def user_with(django_user_model: Any, name: str, *perms: str, staff: bool = True) -> Any:
    user = django_user_model.objects.create_user(name, password="pw", is_staff=staff)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return user


@pytest.fixture
def login_rule() -> Rule:
    return rule("login", "login", 2)


@pytest.fixture
def flushed(login_rule: Rule) -> Rule:
    """Rejections of two clients under 'login' and one under 'api', persisted."""
    rule("api", "api", 1)
    reject("login", CLIENT_IP, times=3)
    reject("login", "198.51.100.4", times=1)
    reject("api", CLIENT_IP, times=2)
    flush()
    return login_rule


def as_user(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


# -- permissions ---------------------------------------------------------------------------


@pytest.fixture(params=["anonymous", "not staff", "staff", "support", "superuser"])
def who(request: Any, django_user_model: Any) -> tuple[str, Client]:
    name = request.param
    if name == "anonymous":
        return name, Client()
    if name == "superuser":
        return name, as_user(django_user_model.objects.create_superuser("root", password="pw"))
    if name == "not staff":
        return name, as_user(user_with(django_user_model, "visitor", staff=False))
    if name == "staff":  # staff, but without the dashboard's permission
        return name, as_user(user_with(django_user_model, "editor", "django_throttle.view_rule"))
    return name, as_user(user_with(django_user_model, "support", "django_throttle.view_dashboard"))


@pytest.mark.parametrize("url", [DASHBOARD, DATA, KEY, KEY + "?rule=1&key=ip:203.0.113.7"])
def test_dashboard_pages_and_data_are_for_staff_with_the_dashboard_permission(who, url, flushed):
    name, client = who
    response = client.get(url)
    if name in ("anonymous", "not staff"):
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")
    elif name == "staff":
        assert response.status_code == 403
    else:
        assert response.status_code == 200
    if response.status_code != 200:
        assert b"ip:203.0.113.7" not in response.content  # nothing of the data leaks


def test_reset_takes_the_permission_to_change_rules(who, login_rule):
    name, client = who
    reject("login")
    response = client.post(KEY, {"rule": login_rule.pk, "key": f"ip:{CLIENT_IP}"})
    if name == "superuser":
        assert response.status_code == 302
        assert remaining("login") == 2
    else:
        assert response.status_code in (302, 403)
        if response.status_code == 302:  # to the login page
            assert response["Location"].startswith("/admin/login/")
        assert remaining("login") == 0
        assert not LogEntry.objects.exists()


def test_support_staff_sees_the_dashboard_on_the_index_but_not_the_rules(django_user_model):
    support = as_user(user_with(django_user_model, "support", "django_throttle.view_dashboard"))
    html = support.get("/admin/").content.decode()
    assert f'href="{DASHBOARD}"' in html
    assert f'href="{RULES}"' not in html
    assert support.get(RULES).status_code == 403


def test_staff_without_the_permission_sees_no_dashboard_link(django_user_model):
    editor = as_user(user_with(django_user_model, "editor", "django_throttle.view_rule"))
    assert f'href="{DASHBOARD}"' not in editor.get("/admin/").content.decode()
    assert f'href="{DASHBOARD}"' not in editor.get(RULES).content.decode()


def test_rule_list_links_to_the_dashboard(admin_client):
    html = admin_client.get(RULES).content.decode()
    assert re.search(rf'<a href="{DASHBOARD}"[^>]*>Dashboard</a>', html)


def test_reset_requires_a_csrf_token(admin_user, login_rule):
    reject("login")
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    response = client.post(KEY, {"rule": login_rule.pk, "key": f"ip:{CLIENT_IP}"})
    assert response.status_code == 403
    assert remaining("login") == 0


# -- what the dashboard shows -----------------------------------------------------------


def test_dashboard_shows_chart_top_keys_recent_and_totals(admin_client, flushed):
    response = admin_client.get(DASHBOARD)
    assert response.status_code == 200
    html = response.content.decode()
    # The chart: one line per rule, drawn on the server.
    assert re.findall(r'<polyline class="series" data-rule="([^"]+)"', html) == ["login", "api"]
    # Totals per rule and action, most rejected first.
    data = response.context["data"]
    assert [(t["rule"], t["reject"], t["total"]) for t in data["totals"]] == [
        ("login", 4, 4),
        ("api", 2, 2),
    ]
    # Top keys with their rule and count.
    top = [(r["client"], r["rule"], r["total"]) for r in data["top_keys"]]
    assert top == [
        (f"ip:{CLIENT_IP}", "login", 3),
        (f"ip:{CLIENT_IP}", "api", 2),
        ("ip:198.51.100.4", "login", 1),
    ]
    assert len(data["recent"]) == 3
    for text in ("Top rejected clients", "Recent rejections", "Totals per rule and action"):
        assert text in html
    assert "<script" not in html.split('id="content-main"')[1]  # readable without JavaScript


def test_json_data_behind_the_chart(admin_client, flushed):
    data = admin_client.get(DATA).json()
    assert data["period"] == "hour"
    assert data["bucket_seconds"] == 60
    assert len(data["buckets"]) == 60
    series = {s["rule"]: s["counts"] for s in data["series"]}
    assert series["login"][-1] == 4  # this minute is the last point
    assert sum(series["login"]) == 4 and sum(series["api"]) == 2
    assert data["totals"][0] == {
        "rule": "login",
        "reject": 4,
        "unavailable": 0,
        "shadow": 0,
        "total": 4,
    }
    assert data["top_keys"][0]["display"] == f"ip:{CLIENT_IP}"


def test_filters_by_rule_and_period(admin_client, login_rule):
    rule("api", "api", 1)
    now = timezone.now().replace(second=0, microsecond=0)
    for rule_name, age, count in (
        ("login", 0, 1),
        ("login", 3 * 60, 10),
        ("api", 2 * 24 * 60, 100),
    ):
        Rejection.objects.create(
            rule=rule_name,
            key=digest("ip:192.0.2.1"),
            display="ip:192.0.2.1",
            action="reject",
            minute=now - timedelta(minutes=age),
            count=count,
        )

    def total(query: str) -> dict[str, int]:
        return {t["rule"]: t["total"] for t in admin_client.get(DATA + query).json()["totals"]}

    assert total("") == {"login": 1}
    assert total("?period=hour") == {"login": 1}
    assert total("?period=day") == {"login": 11}
    assert total("?period=week") == {"api": 100, "login": 11}
    assert total("?period=week&rule=api") == {"api": 100}
    week = admin_client.get(DATA + "?period=week").json()
    assert week["bucket_seconds"] == 2 * 3600
    assert {s["rule"]: sum(s["counts"]) for s in week["series"]} == {"api": 100, "login": 11}
    html = admin_client.get(DASHBOARD + "?period=day&rule=login").content.decode()
    assert '<option value="login" selected>' in html
    assert '<option value="day" selected>' in html


def test_actions_are_told_apart(admin_client):
    rule("closed", "closed", 1, fail_mode="closed")
    rule("trial", "trial", 1, action="log")
    now = timezone.now().timestamp()
    rejection_log().add("closed", "ip:192.0.2.1", "unavailable", when=now)
    trial = partial(RequestFactory().post, "/", REMOTE_ADDR="192.0.2.1")
    assert [check(trial(), "trial").allowed for _ in range(3)] == [True] * 3  # log only
    flush()
    totals = {t["rule"]: t for t in admin_client.get(DATA).json()["totals"]}
    assert (totals["closed"]["unavailable"], totals["closed"]["reject"]) == (1, 0)
    assert (totals["trial"]["shadow"], totals["trial"]["reject"]) == (2, 0)
    html = admin_client.get(DASHBOARD).content.decode()
    assert "failed closed (503)" in html and "shadow" in html


def test_user_keys_show_the_username(admin_client, django_user_model):
    alice = django_user_model.objects.create_user("alice", password="pw")
    rule("per-user", "per-user", 1, key_kind="user")
    rejection_log().add("per-user", f"user:{alice.pk}", "reject")
    flush()
    html = admin_client.get(DASHBOARD).content.decode()
    assert f"user:{alice.pk} (alice)" in html


def test_only_complete_keys_get_an_inspect_link(admin_client, login_rule):
    long_value = "v" * 200
    rejection_log().add("login", f"ip:{CLIENT_IP}", "reject")
    rejection_log().add("login", "header:" + long_value, "reject")
    flush()
    rows = admin_client.get(DASHBOARD).context["data"]["top_keys"]
    links = {row["display"]: row["inspect_url"] for row in rows}
    assert links[f"ip:{CLIENT_IP}"] == f"{KEY}?rule={login_rule.pk}&key=ip%3A{CLIENT_IP}"
    assert links["header:" + "v" * 64 + "\u2026"] is None  # cut short: not the real key


def test_empty_dashboard_says_so(admin_client):
    html = admin_client.get(DASHBOARD).content.decode()
    assert "No rejections in this period." in html
    assert "<polyline" not in html


# -- key inspection and reset ---------------------------------------------------------------


def test_key_state_is_read_without_consuming(admin_client, login_rule):
    reject("login")
    url = f"{KEY}?rule={login_rule.pk}&key=ip:{CLIENT_IP}"
    for _ in range(2):
        response = admin_client.get(url)
        (state,) = response.context["states"]
        assert (state.allowed, state.remaining, state.limit) == (False, 0, 2)
        assert state.reset_at > timezone.now()
    assert remaining("login") == 0
    request = RequestFactory().post("/", REMOTE_ADDR="192.0.2.200")
    assert check(request, "login").remaining == 1  # another client: untouched
    fresh = admin_client.get(f"{KEY}?rule={login_rule.pk}&key=ip:192.0.2.200")
    (state,) = fresh.context["states"]
    assert (state.allowed, state.remaining) == (True, 1)


def test_key_page_warns_when_the_key_cannot_be_the_rules(admin_client, login_rule):
    response = admin_client.get(f"{KEY}?rule={login_rule.pk}&key=user:42")
    (state,) = response.context["states"]
    assert state.warning == "This rule counts keys written ip:..."


def test_reset_clears_the_state_and_is_logged_against_the_rule(django_user_model, login_rule):
    operator = user_with(
        django_user_model,
        "operator",
        "django_throttle.view_dashboard",
        "django_throttle.change_rule",
    )
    client = as_user(operator)
    reject("login", times=2)
    key = f"ip:{CLIENT_IP}"
    response = client.post(KEY, {"rule": login_rule.pk, "key": key})
    assert response.status_code == 302
    assert response["Location"] == f"{KEY}?rule={login_rule.pk}&key=ip%3A{CLIENT_IP}"
    assert remaining("login") == 2

    (entry,) = LogEntry.objects.all()
    assert entry.user == operator
    assert entry.action_flag == CHANGE
    assert entry.get_edited_object() == login_rule
    assert entry.change_message == f"Reset the state of client key {key}."

    page = client.get(response["Location"])
    assert f"Client key {key} reset under rule login." in page.content.decode()
    (state,) = page.context["states"]
    assert state.remaining == 2


def test_support_staff_sees_the_state_but_no_reset_button(django_user_model, login_rule):
    support = as_user(user_with(django_user_model, "support", "django_throttle.view_dashboard"))
    reject("login")
    html = support.get(f"{KEY}?rule={login_rule.pk}&key=ip:{CLIENT_IP}").content.decode()
    assert 'class="remaining">0<' in html
    assert "throttle-reset" not in html
    assert "Resetting a key takes the permission to change rules." in html


def test_rule_action_opens_the_key_page_for_the_selected_rules(admin_client, login_rule):
    other = rule("api", "api", 1)
    response = admin_client.post(
        RULES, {"action": "inspect_key", "_selected_action": [login_rule.pk, other.pk]}
    )
    assert response.status_code == 302
    assert response["Location"] == f"{KEY}?rule={login_rule.pk}&rule={other.pk}"
    page = admin_client.get(response["Location"])
    assert sorted(page.context["form"].initial["rule"]) == sorted(
        [str(login_rule.pk), str(other.pk)]
    )


def test_key_page_shows_every_selected_rule(admin_client, login_rule):
    other = rule("login-daily", "login", 10, unit="day")
    reject("login")
    response = admin_client.get(f"{KEY}?rule={login_rule.pk}&rule={other.pk}&key=ip:{CLIENT_IP}")
    states = {s.rule.name: s.remaining for s in response.context["states"]}
    assert states == {"login": 0, "login-daily": 8}


def test_key_page_shows_a_bucket_out_of_its_burst_and_the_rate_in_words(admin_client):
    bucket = rule("bucket", "bucket", 10, per=15, unit="minute", algorithm="leaky_bucket", burst=5)
    html = admin_client.get(f"{KEY}?rule={bucket.pk}&key=ip:{CLIENT_IP}").content.decode()
    assert re.search(r'class="remaining">5</span> / 5<', html)
    assert "10 per 15 minutes" in html


def test_key_page_shows_a_block_and_its_reset_clears_it(admin_client):
    blocking = rule("blocking", "blocking", 1, block_seconds=3600)
    requests = [RequestFactory().get("/", REMOTE_ADDR=CLIENT_IP) for _ in range(2)]
    assert [check(request, "blocking").allowed for request in requests] == [True, False]
    url = f"{KEY}?rule={blocking.pk}&key=ip:{CLIENT_IP}"
    html = admin_client.get(url).content.decode()
    assert "throttle-blocked" in html and re.search(r"blocked for 3[56]\d\d s", html)
    admin_client.post(KEY, {"rule": blocking.pk, "key": f"ip:{CLIENT_IP}"})
    assert "throttle-blocked" not in admin_client.get(url).content.decode()
    assert check(RequestFactory().get("/", REMOTE_ADDR=CLIENT_IP), "blocking").allowed


def test_key_page_shows_a_client_s_override(admin_client):
    from django_throttle.models import Override

    api = rule("api", "api", 2)
    Override.objects.create(rule=api, key=f"ip:{CLIENT_IP}", limit=7)
    Override.objects.create(rule=api, key="user:9", exempt=True)
    (state,) = admin_client.get(f"{KEY}?rule={api.pk}&key=ip:{CLIENT_IP}").context["states"]
    assert (state.limit, state.remaining) == (7, 7)
    (exempt,) = admin_client.get(f"{KEY}?rule={api.pk}&key=user:9").context["states"]
    assert "exempt" in exempt.error


def test_code_default_scopes_are_inspected_and_reset_on_the_key_page(admin_client):
    requests = [RequestFactory().get("/", REMOTE_ADDR=CLIENT_IP) for _ in range(2)]
    assert all(check(request, "search").allowed for request in requests)  # @throttle 3/m
    page = admin_client.get(KEY)
    assert '<option value="search">search</option>' in page.content.decode()
    url = f"{KEY}?scope=search&key=ip:{CLIENT_IP}"
    (state,) = admin_client.get(url).context["states"]
    assert (state.rule.name, state.remaining, state.limit) == ("search (code default)", 1, 3)
    assert "3 per minute" in admin_client.get(url).content.decode()
    response = admin_client.post(KEY, {"scope": "search", "key": f"ip:{CLIENT_IP}"})
    assert response.status_code == 302
    (state,) = admin_client.get(url).context["states"]
    assert state.remaining == 3


def test_the_key_page_asks_for_rules_or_a_scope(admin_client):
    page = admin_client.get(f"{KEY}?key=ip:{CLIENT_IP}")
    assert page.status_code == 200
    assert "Choose rules, or a scope with code defaults." in page.content.decode()


# -- pages that do not grow with the rule table ------------------------------------------------

MANY = 500


def many_rules() -> list[Rule]:
    Rule.objects.bulk_create(
        Rule(name=f"rule-{n:04d}", scope=f"/r{n}/", limit=2) for n in range(MANY)
    )
    return list(Rule.objects.order_by("name"))


def rule_options(html: str) -> list[str]:
    """The options of the page's rule pickers (a <select name="rule">)."""
    pickers = re.findall(r'<select name="rule"[^>]*>(.*?)</select>', html, re.DOTALL)
    assert pickers, "no rule picker"
    return [option for picker in pickers for option in re.findall(r"<option\b[^>]*>", picker)]


def test_the_pages_hold_the_chosen_rules_not_every_rule(admin_client):
    rules = many_rules()
    chosen = rules[123]
    reject(chosen.scope)
    flush()
    pages = {
        "dashboard": admin_client.get(DASHBOARD).content.decode(),
        "filtered": admin_client.get(f"{DASHBOARD}?rule={chosen.name}").content.decode(),
        "key": admin_client.get(f"{KEY}?rule={chosen.pk}&key=ip:{CLIENT_IP}").content.decode(),
    }
    for name, html in pages.items():
        # An empty choice (the filter) and the chosen rule, of the 500.
        assert len(rule_options(html)) <= 2, name
        assert "rule-0499" not in html and "/r499/" not in html, name
        assert len(html) < 60_000, name
        assert 'data-ajax--url="/admin/django_throttle/dashboard/rules/' in html, name
        assert "admin/js/vendor/select2/select2.full.min.js" in html, name
    # The chosen rule is chosen, and what it picks still works.
    assert f'<option value="{chosen.name}" selected>{chosen.name}</option>' in pages["filtered"]
    filtered = admin_client.get(f"{DASHBOARD}?rule={chosen.name}")
    assert [t["rule"] for t in filtered.context["data"]["totals"]] == [chosen.name]
    key = pages["key"]
    assert re.search(rf'<option value="{chosen.pk}" selected>{re.escape(chosen.name)}:', key)
    assert f'data-rule="{chosen.name}"' in key and '<span class="remaining">0</span>' in key
    # The top client's Act menu names its rule by id, found without reading the table.
    assert f'name="rule" value="{chosen.pk}"' in pages["dashboard"]


def test_the_pickers_search_rules_by_name_or_scope_a_page_at_a_time(admin_client):
    rules = many_rules()
    found = admin_client.get(f"{DASHBOARD}rules/", {"term": "rule-012"}).json()
    assert [r["id"] for r in found["results"]] == [str(r.pk) for r in rules[120:130]]
    assert found["results"][0]["text"] == str(rules[120])
    assert found["pagination"] == {"more": False}
    by_scope = admin_client.get(f"{DASHBOARD}rules/", {"term": "/r499/"}).json()
    assert [r["id"] for r in by_scope["results"]] == [str(rules[499].pk)]
    first = admin_client.get(f"{DASHBOARD}rules/", {"term": "rule-", "page": "1"}).json()
    second = admin_client.get(f"{DASHBOARD}rules/", {"term": "rule-", "page": "2"}).json()
    assert len(first["results"]) == len(second["results"]) == 20
    assert first["pagination"]["more"] and second["results"][0]["id"] == str(rules[20].pk)
    for page in ("0", "-3", "abc", "99999999999999999999999"):
        response = admin_client.get(f"{DASHBOARD}rules/", {"term": "rule-", "page": page})
        assert response.status_code == 200
    names = admin_client.get(f"{DASHBOARD}rules/", {"term": "rule-0007", "by": "name"}).json()
    assert names["results"] == [{"id": "rule-0007", "text": "rule-0007"}]
    # The filter takes a scope's code defaults too (tests/views.py: @throttle("search", rate=...)).
    scopes = admin_client.get(f"{DASHBOARD}rules/", {"term": "sear", "by": "name"}).json()
    assert {"id": "search", "text": "search (code default)"} in scopes["results"]


def test_the_pickers_search_asks_the_dashboards_permission(django_user_model):
    many_rules()
    support = Client()
    support.force_login(user_with(django_user_model, "support", "django_throttle.view_dashboard"))
    assert support.get(f"{DASHBOARD}rules/", {"term": "rule-0001"}).status_code == 200
    other = Client()
    other.force_login(user_with(django_user_model, "other", "django_throttle.view_rule"))
    assert other.get(f"{DASHBOARD}rules/", {"term": "rule-0001"}).status_code == 403
