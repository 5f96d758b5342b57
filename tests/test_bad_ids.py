"""Every id the admin and the dashboard take from a URL, a query or a form, out of range or not
a number at all: a 404, a redirect or a form error, never a 500 (SQLite cannot even bind an
integer beyond 64 bits: OverflowError)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from django_throttle.models import Override
from tests.helpers import rule

pytestmark = pytest.mark.django_db

ADMIN = "/admin/django_throttle/"
KEY = ADMIN + "dashboard/key/"
BAD_IDS = [
    "99999999999999999999",  # beyond 64 bits
    "18446744073709551616",  # 2**64
    "9223372036854775808",  # 2**63: one past the largest signed 64-bit integer
    "-99999999999999999999",
    "1e3",
    "abc",
    "１２",  # full-width digits: int() reads them
    " 7",
]


def staff(django_user_model: Any, *perms: str, superuser: bool = False) -> Client:
    make = django_user_model.objects.create_superuser if superuser else None
    if make is not None:
        user = make("boss", password="pw")
    else:
        user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
        for perm in perms:
            app_label, codename = perm.split(".")
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label=app_label, codename=codename)
            )
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


@pytest.fixture
def viewer(django_user_model: Any) -> Client:
    """A view-only user of the dashboard and the rules."""
    return staff(
        django_user_model,
        "django_throttle.view_dashboard",
        "django_throttle.view_rule",
        "django_throttle.view_override",
        "django_throttle.view_ban",
    )


@pytest.fixture
def boss(django_user_model: Any) -> Client:
    return staff(django_user_model, superuser=True)


@pytest.fixture
def api() -> Any:
    made = rule("api", "/api/", 5)
    Override.objects.create(rule=made, key="ip:203.0.113.7", limit=9)
    return made


def assert_answered(response: Any, *allowed: int) -> None:
    assert response.status_code in allowed, (response.status_code, response.content[:300])


@pytest.mark.parametrize("bad", BAD_IDS)
def test_key_page_with_a_bad_rule_id_is_a_form_error(viewer: Client, api: Any, bad: str) -> None:
    response = viewer.get(KEY, {"rule": [bad], "key": "ip:203.0.113.7"})
    assert_answered(response, 200)
    assert response.context["form"].errors["rule"]
    both = viewer.get(KEY, {"rule": [str(api.pk), bad], "key": "ip:203.0.113.7"})
    assert_answered(both, 200)
    assert both.context["form"].errors["rule"]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_dashboard_pages_with_a_bad_rule_are_answered(viewer: Client, api: Any, bad: str) -> None:
    assert_answered(viewer.get(ADMIN + "dashboard/", {"rule": bad}), 200)
    assert_answered(viewer.get(ADMIN + "dashboard/data/", {"rule": bad}), 200)


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize(
    "fields",
    [
        {"action": "block", "seconds": "900"},
        {"action": "unblock"},
        {"action": "exempt"},
        {"action": "limit", "limit": "3"},
    ],
)
def test_an_action_with_a_bad_rule_id_is_a_form_error(
    boss: Client, api: Any, bad: str, fields: dict[str, str]
) -> None:
    response = boss.post(KEY, {"rule": bad, "key": "ip:203.0.113.7", **fields})
    assert_answered(response, 302)
    assert Override.objects.get().limit == 9  # nothing done


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize(
    "fields",
    [
        {"action": "block", "seconds": "{bad}"},
        {"action": "limit", "limit": "{bad}"},
        {"action": "exempt", "expires": "{bad}"},
    ],
)
def test_an_action_with_a_bad_number_is_a_form_error(
    boss: Client, api: Any, bad: str, fields: dict[str, str]
) -> None:
    data = {"rule": str(api.pk), "key": "ip:203.0.113.7"}
    data.update({k: v.format(bad=bad) for k, v in fields.items()})
    assert_answered(boss.post(KEY, data), 302)
    if bad.strip() not in ("7", "１２"):  # a limit of 7 or 12: numbers Django reads
        assert Override.objects.get().limit == 9


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("model", ["rule", "override", "ban"])
@pytest.mark.parametrize("page", ["change/", "history/", "delete/"])
def test_object_pages_with_a_bad_id(
    viewer: Client, boss: Client, bad: str, model: str, page: str
) -> None:
    for client in (viewer, boss):
        # Django's admin answers an id it cannot find with a redirect to the list.
        assert_answered(client.get(f"{ADMIN}{model}/{bad}/{page}"), 302, 403, 404)


@pytest.mark.parametrize("bad", BAD_IDS)
def test_lists_filtered_by_a_bad_id(viewer: Client, api: Any, bad: str) -> None:
    for url in (
        f"{ADMIN}override/?rule__id__exact={bad}",
        f"{ADMIN}rule/?id={bad}",
        f"{ADMIN}rule/?pk={bad}",
    ):
        assert_answered(viewer.get(url), 200, 302)


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("action", ["enable_rules", "export_rules", "inspect_key"])
def test_rule_actions_on_a_bad_id(boss: Client, api: Any, bad: str, action: str) -> None:
    response = boss.post(f"{ADMIN}rule/", {"action": action, "_selected_action": [bad]})
    assert_answered(response, 200, 302)


def rule_search(boss: Client, term: str) -> Any:
    """The override form's rule search (the admin's autocomplete) for ``term``."""
    query = {"app_label": "django_throttle", "model_name": "override", "field_name": "rule"}
    return boss.get("/admin/autocomplete/", {**query, "term": term})


@pytest.mark.parametrize("bad", BAD_IDS)
def test_an_override_form_with_a_bad_rule_id(boss: Client, api: Any, bad: str) -> None:
    override = boss.post(
        f"{ADMIN}override/add/", {"rule": bad, "key": "ip:198.51.100.1", "limit": "2"}
    )
    assert_answered(override, 200)
    assert override.context["adminform"].form.errors["rule"]
    assert_answered(rule_search(boss, bad), 200)


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_rule_form_with_bad_group_ids(boss: Client, bad: str) -> None:
    fields = {
        "name": "new",
        "scope": "/new/",
        "limit": "5",
        "per": "1",
        "unit": "minute",
        "algorithm": "fixed_window",
        "key_kind": "ip",
        "action": "reject",
        "fail_mode": "default",
        "applies_to": "all",
        "enabled": "on",
        "block_seconds": "0",
        "block_growth": "1",
        "groups": [bad],
        "exempt_groups": [bad],
        "overrides-TOTAL_FORMS": "0",
        "overrides-INITIAL_FORMS": "0",
    }
    response = boss.post(f"{ADMIN}rule/add/", fields)
    assert_answered(response, 200)
    errors = response.context["adminform"].form.errors
    assert "groups" in errors and "exempt_groups" in errors
