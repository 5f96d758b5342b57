"""Rules through the real Django admin, as a logged-in superuser."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.utils import timezone
from django.utils.html import escape

from django_throttle.models import Rejection, Rule

pytestmark = [pytest.mark.db_matters, pytest.mark.django_db]

CHANGELIST = "/admin/django_throttle/rule/"
ADD = "/admin/django_throttle/rule/add/"
VERSION_KEY = "thr:rules:version"


def form_data(**fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "login",
        "enabled": "on",
        "scope": "login",
        "methods": "",
        "key_kind": "ip",
        "key_arg": "",
        "limit": "5",
        "per": "1",
        "unit": "minute",
        "algorithm": "sliding_window_log",
        "burst": "",
        "block_seconds": "0",
        "block_growth": "1",
        "applies_to": "all",
        "exempt_networks": "",
        "action": "reject",
        "fail_mode": "default",
        # the overrides inline's management form
        "overrides-TOTAL_FORMS": "0",
        "overrides-INITIAL_FORMS": "0",
        "overrides-MIN_NUM_FORMS": "0",
        "overrides-MAX_NUM_FORMS": "1000",
        "_save": "Save",
    }
    data.update(fields)
    return data


@pytest.fixture
def rules() -> list[Rule]:
    return [
        Rule.objects.create(name="login", scope="login", limit=5, algorithm="sliding_window_log"),
        Rule.objects.create(
            name="api",
            scope="/api/",
            key_kind="header",
            key_arg="X-Api-Key",
            limit=10,
            unit="second",
            algorithm="token_bucket",
            burst=50,
        ),
        Rule.objects.create(
            name="search",
            scope="search",
            key_kind="user_or_ip",
            limit=30,
            algorithm="fixed_window",
            enabled=False,
        ),
    ]


def listed(response: Any) -> list[str]:
    assert response.status_code == 200
    return [rule.name for rule in response.context["cl"].result_list]


# -- changelist ------------------------------------------------------------------


def test_changelist_renders_the_list_columns(admin_client, rules):
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    columns = [
        "name",
        "scope",
        "methods_shown",
        "rate",
        "key",
        "algorithm",
        "action",
        "enabled",
        "state",
        "rejected_last_hour",
        "in_words",
    ]
    assert list(response.context["cl"].list_display) == ["action_checkbox", *columns]
    html = response.content.decode()
    for column in columns:
        assert f"column-{column}" in html
    assert "10 per second (burst 50)" in html
    # The Key column names each kind by its label (translated), not by its stored value.
    assert '<td class="field-key">request header: X-Api-Key</td>' in html
    assert '<td class="field-key">user, or IP when anonymous</td>' in html
    assert listed(response) == ["api", "login", "search"]


def test_changelist_explains_each_rule_and_counts_its_recent_rejections(admin_client):
    rule_row = Rule.objects.create(
        name="login",
        scope="failed-login",
        methods="POST",
        limit=5,
        per=15,
        unit="minute",
        block_seconds=3600,
        exempt_staff=True,
    )
    Rejection.objects.create(
        rule="login", key="k", display="ip:1", action="reject", minute=timezone.now(), count=7
    )
    Rejection.objects.create(
        rule="login",
        key="k",
        display="ip:1",
        action="reject",
        minute=timezone.now() - timedelta(hours=2),
        count=100,
    )
    html = admin_client.get(CHANGELIST).content.decode()
    explanation = (
        "at most 5 requests per 15 minutes per client IP, then blocked for 1 hour; "
        "POST only; staff exempt"
    )
    assert explanation in html
    assert re.search(r'class="field-rejected_last_hour">7<', html)
    assert re.search(r'class="field-methods_shown">POST<', html)
    form = admin_client.get(f"/admin/django_throttle/rule/{rule_row.pk}/change/").content
    assert explanation in form.decode()
    headings = re.findall(r'class="fieldset-heading">([^<]*)<', form.decode())
    assert "Timestamps" in headings and "History" not in headings  # the admin's own button


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ("algorithm__exact=token_bucket", ["api"]),
        ("algorithm__exact=fixed_window", ["search"]),
        ("key_kind__exact=header", ["api"]),
        ("enabled__exact=0", ["search"]),
        ("enabled__exact=1", ["api", "login"]),
        ("action__exact=log", []),
    ],
)
def test_changelist_filters(admin_client, rules, query, names):
    assert listed(admin_client.get(f"{CHANGELIST}?{query}")) == names


@pytest.mark.parametrize(
    ("q", "names"), [("login", ["login"]), ("sea", ["search"]), ("/api/", ["api"]), ("zzz", [])]
)
def test_changelist_search_by_name_and_scope(admin_client, rules, q, names):
    assert listed(admin_client.get(CHANGELIST, {"q": q})) == names


def test_search_finds_a_rule_by_its_scope_only(admin_client):
    Rule.objects.create(name="everything", scope="*", limit=100)
    Rule.objects.create(name="users", scope=r"^/users/\d+/$", limit=100)
    assert listed(admin_client.get(CHANGELIST, {"q": "^/users"})) == ["users"]


# -- add form ---------------------------------------------------------------------


def test_add_page_renders_the_fieldsets_and_help_texts(admin_client):
    response = admin_client.get(ADD)
    assert response.status_code == 200
    fieldsets = {fieldset.name: fieldset.fields for fieldset in response.context["adminform"]}
    assert fieldsets["Matching"] == ("scope", "methods", "count_statuses", "cost_header")
    assert fieldsets["Limit"] == (
        "key_kind",
        "key_arg",
        "limit",
        "per",
        "unit",
        "algorithm",
        "burst",
    )
    assert fieldsets["Behaviour"] == ("block_seconds", "block_growth", "action", "fail_mode")
    html = response.content.decode()
    for heading in ("Matching", "Limit", "Behaviour"):
        assert heading in html
    assert "Requests allowed per unit of time. Example: 5 (with unit minute)." in html
    assert "Sliding window counter is a good default" in html
    assert "Token and leaky bucket only: the bucket size" in html
    assert "Closed suits login and password reset" in html
    assert "django_throttle/admin.css" in html


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"scope": "^(unclosed"}, "scope", "Invalid regular expression"),
        ({"scope": "log in"}, "scope", "A scope name cannot contain spaces."),
        ({"key_kind": "header", "key_arg": ""}, "key_arg", "Name the header to key on"),
        ({"key_kind": "header", "key_arg": "X Key"}, "key_arg", "is not a valid header name"),
        ({"key_kind": "ip", "key_arg": "q"}, "key_arg", "Only header, param and custom keys"),
        ({"limit": "0"}, "limit", "The limit must allow at least 1 request."),
        ({"limit": "-5"}, "limit", "The limit must allow at least 1 request."),
        (
            {"algorithm": "fixed_window", "burst": "10"},
            "burst",
            "Only token bucket and leaky bucket have a burst; leave it empty for fixed window.",
        ),
        (
            {"key_kind": "custom", "key_arg": "nope"},
            "key_arg",
            "No key function named 'nope' in DJANGO_THROTTLE['KEY_FUNCTIONS'] "
            "(registered: tenant).",
        ),
        ({"action": "delay"}, "action", "Delay works with the leaky bucket algorithm only."),
        ({"methods": "GET POST"}, "methods", "is not an HTTP method"),
    ],
)
def test_bad_input_rerenders_the_form_with_the_error_on_the_field(
    admin_client, fields, field, message
):
    response = admin_client.post(ADD, form_data(**fields))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors, errors
    assert any(message in error for error in errors[field]), errors[field]
    assert escape(message) in response.content.decode()
    assert not Rule.objects.exists()


def test_valid_post_creates_the_rule(admin_client):
    response = admin_client.post(
        ADD,
        form_data(
            name="api",
            scope=" /api/ ",
            methods="post, put",
            key_kind="header",
            key_arg="X-Api-Key",
            limit="10",
            unit="second",
            algorithm="token_bucket",
            burst="50",
            fail_mode="closed",
        ),
    )
    assert response.status_code == 302
    assert response["Location"] == CHANGELIST
    rule = Rule.objects.get()
    assert (rule.name, rule.scope, rule.methods) == ("api", "/api/", "POST,PUT")
    assert (rule.key_kind, rule.key_arg, rule.limit, rule.unit) == (
        "header",
        "X-Api-Key",
        10,
        "second",
    )
    assert (rule.algorithm, rule.burst, rule.fail_mode, rule.enabled) == (
        "token_bucket",
        50,
        "closed",
        True,
    )


def test_duplicate_name_is_refused(admin_client, rules):
    response = admin_client.post(ADD, form_data(scope="/other/"))
    assert response.status_code == 200
    assert "already exists" in response.context["adminform"].form.errors["name"][0]
    assert Rule.objects.count() == 3


def test_saving_a_rule_in_the_admin_announces_the_change(
    admin_client, rules, redis_client, django_capture_on_commit_callbacks
):
    rule = rules[0]
    assert not redis_client.exists(VERSION_KEY)
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            f"{CHANGELIST}{rule.pk}/change/", form_data(limit="7", enabled="")
        )
    assert response.status_code == 302
    rule.refresh_from_db()
    assert (rule.limit, rule.enabled) == (7, False)
    assert redis_client.exists(VERSION_KEY)


# -- bulk actions -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "enabled", "message"),
    [("disable_rules", False, "2 rules disabled."), ("enable_rules", True, "2 rules enabled.")],
)
def test_bulk_action_sets_enabled_and_announces_the_change(
    admin_client, rules, redis_client, django_capture_on_commit_callbacks, action, enabled, message
):
    login, api, search = rules
    Rule.objects.filter(pk=api.pk).update(enabled=not enabled)
    redis_client.delete(VERSION_KEY)  # only the bulk action below may write it
    assert not redis_client.exists(VERSION_KEY)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = admin_client.post(
            CHANGELIST, {"action": action, "_selected_action": [login.pk, api.pk]}
        )
    assert response.status_code == 302
    assert [str(m) for m in get_messages(response.wsgi_request)] == [message]
    assert Rule.objects.get(pk=login.pk).enabled is enabled
    assert Rule.objects.get(pk=api.pk).enabled is enabled
    assert Rule.objects.get(pk=search.pk).enabled is False  # not selected
    # QuerySet.update() sends no signals, yet other processes are told.
    assert callbacks
    assert redis_client.exists(VERSION_KEY)


def test_bulk_action_message_is_shown_on_the_changelist(admin_client, rules):
    response = admin_client.post(
        CHANGELIST, {"action": "enable_rules", "_selected_action": [rules[2].pk]}, follow=True
    )
    assert response.status_code == 200
    assert "1 rule enabled." in response.content.decode()
    assert Rule.objects.filter(enabled=True).count() == 3


@pytest.mark.django_db(transaction=True)
def test_bulk_action_announces_the_change_after_a_real_commit(admin_client, redis_client):
    rule = Rule.objects.create(name="login", scope="login", limit=5)
    redis_client.delete(VERSION_KEY)
    response = admin_client.post(
        CHANGELIST, {"action": "disable_rules", "_selected_action": [rule.pk]}
    )
    assert response.status_code == 302
    assert Rule.objects.get().enabled is False
    assert redis_client.exists(VERSION_KEY)
