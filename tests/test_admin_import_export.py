"""Rules in and out through the real admin: the export action, the import page, the rule form."""

from __future__ import annotations

import json
import re
import sys
import threading
from typing import Any

import pytest
import yaml
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Group, Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from django_throttle.management.rulefiles import MAX_FILE_BYTES, import_rules, load
from django_throttle.models import Override, Rule
from tests.test_admin import form_data

pytestmark = [pytest.mark.db_matters, pytest.mark.django_db]

CHANGELIST = "/admin/django_throttle/rule/"
IMPORT = "/admin/django_throttle/rule/import/"
ADD = "/admin/django_throttle/rule/add/"
VERSION_KEY = "thr:rules:version"

FILE = """
rules:
  - name: login
    scope: login
    methods: POST
    limit: 10
    per: 15
    block_seconds: 3600
    overrides:
      - {key: "ip:203.0.113.7", exempt: true}
  - name: search
    scope: search
    limit: 30
"""


@pytest.fixture
def rules() -> dict[str, Rule]:
    login = Rule.objects.create(name="login", scope="login", methods="POST", limit=5, per=15)
    old = Rule.objects.create(name="old", scope="/old/", limit=1)
    api = Rule.objects.create(name="api", scope="/api/", limit=100, unit="hour")
    Override.objects.create(rule=api, key="user:42", limit=1000)
    api.exempt_groups.add(Group.objects.create(name="partners"))
    return {"login": login, "old": old, "api": api}


def upload(name: str, text: str | bytes) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, text.encode() if isinstance(text, str) else text)


def preview(client: Client, text: str, prune: bool = False, name: str = "rules.yaml") -> Any:
    data: dict[str, Any] = {"file": upload(name, text)}
    if prune:
        data["prune"] = "on"
    return client.post(IMPORT, data)


def token_of(response: Any) -> str:
    found = re.search(r'name="token" value="([^"]+)"', response.content.decode())
    assert found, "the preview offers no Apply button"
    return found.group(1)


def table(rules: dict[str, Rule] | None = None) -> dict[str, tuple[Any, ...]]:
    return {
        r.name: (r.scope, r.limit, r.per, r.block_seconds, sorted(o.key for o in r.overrides.all()))
        for r in Rule.objects.all()
    }


def staff(django_user_model: Any, *codenames: str) -> Client:
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


# -- export -------------------------------------------------------------------------------


def export(client: Client, *rules: Rule) -> Any:
    return client.post(
        CHANGELIST,
        {"action": "export_rules", "_selected_action": [str(r.pk) for r in rules]},
    )


def test_the_export_action_downloads_the_selected_rules_as_yaml(admin_client, rules):
    response = export(admin_client, rules["api"], rules["login"])
    assert response.status_code == 200
    assert response["Content-Type"] == "application/yaml; charset=utf-8"
    assert re.fullmatch(
        r'attachment; filename="throttle-rules-\d{8}-\d{6}\.yaml"',
        response["Content-Disposition"],
    )
    data = yaml.safe_load(response.content)
    assert [r["name"] for r in data["rules"]] == ["api", "login"]  # "old" was not selected
    api = data["rules"][0]
    assert (api["scope"], api["limit"], api["unit"]) == ("/api/", 100, "hour")
    assert api["exempt_groups"] == ["partners"]
    assert api["overrides"] == [{"key": "user:42", "limit": 1000}]
    # The throttle_import format: the download imports back as it is, changing nothing.
    plan = import_rules(load(response.content.decode(), "yaml"), prune=False, dry_run=True)
    assert (plan.create, plan.change, plan.unchanged) == ([], [], ["api", "login"])


def test_the_export_action_writes_json_without_pyyaml(admin_client, rules, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # `import yaml` raises ImportError
    response = export(admin_client, rules["old"])
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert re.fullmatch(
        r'attachment; filename="throttle-rules-\d{8}-\d{6}\.json"',
        response["Content-Disposition"],
    )
    data = json.loads(response.content)
    assert data["rules"][0]["name"] == "old" and len(data["rules"]) == 1


def test_a_view_only_user_may_export(django_user_model, rules):
    client = staff(django_user_model, "view_rule")
    response = export(client, rules["old"])
    assert response.status_code == 200
    assert yaml.safe_load(response.content)["rules"][0]["name"] == "old"


# -- import: preview, apply, prune -------------------------------------------------------


def test_the_changelist_links_to_the_import_page(admin_client, rules):
    html = admin_client.get(CHANGELIST).content.decode()
    assert f'href="{IMPORT}"' in html and "Import rules" in html
    page = admin_client.get(IMPORT)
    assert page.status_code == 200
    assert 'enctype="multipart/form-data"' in page.content.decode()


def test_the_preview_lists_what_would_be_created_changed_and_deleted(admin_client, rules):
    before = table()
    response = preview(admin_client, FILE, prune=True)
    assert response.status_code == 200
    assert table() == before  # a dry run: nothing written
    context = response.context
    assert [name for name, _ in context["created"]] == ["search"]
    assert "at most 30 requests per minute per client IP" in context["created"][0][1]
    ((name, changes),) = context["changed"]
    assert name == "login"
    shown = {c.label: (c.old, c.new) for c in changes}
    assert shown == {
        "Limit": ("5", "10"),
        "Block for (seconds)": ("0", "3600"),
        "Overrides": ("-", "ip:203.0.113.7 (exempt)"),
    }
    assert [name for name, _ in context["deleted"]] == ["api", "old"]
    html = response.content.decode()
    assert '<tr data-rule="search">' in html
    assert "<del>5</del>" in html and "<ins>10</ins>" in html
    assert 'id="throttle-import-deleted"' in html
    token_of(response)


def test_the_preview_says_a_buckets_burst(admin_client):
    buckets = """
rules:
  - {name: api, scope: /api/, limit: 5, unit: second, algorithm: token_bucket, burst: 20}
  - {name: queue, scope: /q/, limit: 1, unit: second, algorithm: leaky_bucket, burst: 1}
"""
    created = dict(preview(admin_client, buckets).context["created"])
    assert created["api"] == (
        "at most 5 requests per second per client IP, in bursts of up to 20 requests"
    )
    assert created["queue"].endswith(", in bursts of up to 1 request")


def test_without_prune_nothing_is_deleted(admin_client, rules):
    response = preview(admin_client, FILE)
    assert response.context["deleted"] == []
    assert 'id="throttle-import-deleted"' not in response.content.decode()
    admin_client.post(IMPORT, {"token": token_of(response)})
    assert set(table()) == {"api", "login", "old", "search"}


def test_apply_writes_the_previewed_import_logs_it_and_reloads_the_rules(
    admin_client, rules, redis_client, django_capture_on_commit_callbacks
):
    token = token_of(preview(admin_client, FILE, prune=True))
    redis_client.delete(VERSION_KEY)
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(IMPORT, {"token": token})
    assert response.status_code == 302 and response["Location"] == CHANGELIST
    assert table() == {
        "login": ("login", 10, 15, 3600, ["ip:203.0.113.7"]),
        "search": ("search", 30, 1, 0, []),
    }
    assert redis_client.exists(VERSION_KEY)  # every process reloads
    page = admin_client.get(CHANGELIST).content.decode()
    assert "Imported rules.yaml: 1 rule created, 1 changed, 2 deleted, 0 unchanged." in page
    logged = {
        (e.object_repr.split(":")[0], e.action_flag, e.change_message)
        for e in LogEntry.objects.all()
    }
    assert logged == {
        ("search", ADDITION, "Added by importing rules.yaml."),
        ("login", CHANGE, "Changed Limit, Block for (seconds), Overrides by importing rules.yaml."),
        ("api", DELETION, "Deleted by importing rules.yaml."),
        ("old", DELETION, "Deleted by importing rules.yaml."),
    }
    login = LogEntry.objects.get(action_flag=CHANGE)
    assert login.object_id == str(rules["login"].pk)


def test_a_file_that_changes_nothing_offers_no_apply(admin_client, rules):
    exported = export(admin_client, *rules.values()).content.decode()
    response = preview(admin_client, exported)
    assert response.context["nothing"] is True
    assert 'name="token"' not in response.content.decode()
    assert "3 rules of the file are unchanged." in response.content.decode()


# -- all or nothing, and clear errors --------------------------------------------------------


def test_a_bad_rule_is_named_and_nothing_is_written(admin_client, rules):
    before = table()
    bad = FILE + "  - name: broken\n    scope: x\n    limit: 0\n"
    response = preview(admin_client, bad, prune=True)
    assert response.status_code == 400
    html = response.content.decode()
    # One sentence, one full stop (not "request.; nothing was written.").
    assert (
        "rule &#x27;broken&#x27;: limit: The limit must allow at least 1 request; "
        "nothing was written." in html
    )
    assert 'name="token"' not in html
    assert table() == before


def test_apply_is_all_or_nothing(admin_client, rules):
    """A rule that became invalid between preview and apply (its group deleted) leaves every
    rule as it was, the valid ones too."""
    Group.objects.create(name="staff-team")
    text = FILE + "  - name: team\n    scope: team\n    limit: 3\n    groups: [staff-team]\n"
    token = token_of(preview(admin_client, text, prune=True))
    Group.objects.filter(name="staff-team").delete()
    before = table()
    response = admin_client.post(IMPORT, {"token": token})
    assert response.status_code == 400
    assert "rule &#x27;team&#x27;: groups: no group staff-team" in response.content.decode()
    assert table() == before
    assert not LogEntry.objects.exists()


def test_a_rule_changed_since_the_preview_is_shown_again_not_written(admin_client, rules):
    token = token_of(preview(admin_client, FILE))
    Rule.objects.filter(name="login").update(limit=7)
    before = table()
    response = admin_client.post(IMPORT, {"token": token})
    assert response.status_code == 200
    assert "The rules changed since the preview" in response.content.decode()
    assert table() == before and not LogEntry.objects.exists()
    changes = {c.label: (c.old, c.new) for c in response.context["changed"][0][1]}
    assert changes["Limit"] == ("7", "10")
    admin_client.post(IMPORT, {"token": token_of(response)})  # the new preview applies
    assert table()["login"][1] == 10


def test_an_altered_token_is_refused(admin_client, rules):
    token = token_of(preview(admin_client, FILE, prune=True))
    before = table()
    forged = token.replace(token[5], "A" if token[5] != "A" else "B", 1)
    response = admin_client.post(IMPORT, {"token": forged})
    assert response.status_code == 400
    assert "This preview cannot be applied: upload the file again." in response.content.decode()
    assert table() == before


def test_another_users_token_is_refused(admin_client, django_user_model, rules):
    token = token_of(preview(admin_client, FILE))
    other = django_user_model.objects.create_superuser("other", "o@example.com", "pw")
    client = Client()
    client.force_login(other)
    assert client.post(IMPORT, {"token": token}).status_code == 400
    assert table()["login"][1] == 5


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("rules.yaml", "rules: [unclosed", "rules.yaml: the file cannot be read as YAML"),
        ("rules.json", '{"rules": [', "rules.json: the file cannot be read as JSON"),
        ("rules.yaml", b"rules: [\xff]", "the file is not UTF-8 text: byte 0xff"),
        ("rules.json", '{"other": []}', "the file must hold a list under &quot;rules&quot;"),
        ("rules.yaml", "", "The submitted file is empty."),
        ("rules.yaml", "# nothing\n", "the file must hold a list under &quot;rules&quot;"),
    ],
)
def test_a_file_that_is_not_a_rule_file_is_a_clear_error(admin_client, rules, name, text, message):
    response = admin_client.post(IMPORT, {"file": upload(name, text)})
    assert response.status_code == 400
    assert message in response.content.decode()


def test_a_file_too_large_is_refused(admin_client, rules):
    response = preview(admin_client, " " * (MAX_FILE_BYTES + 1))
    assert response.status_code == 400
    assert "the file is larger than 16 MiB, the most a rule file may be" in (
        response.content.decode()
    )


def test_a_yaml_file_without_pyyaml_is_a_clear_error(admin_client, rules, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)
    response = preview(admin_client, FILE)
    assert response.status_code == 400
    assert "YAML needs PyYAML" in response.content.decode()
    response = preview(admin_client, json.dumps(yaml.safe_load(FILE)), name="rules.json")
    assert response.status_code == 200 and token_of(response)


def test_no_file_is_a_form_error(admin_client):
    response = admin_client.post(IMPORT, {})
    assert response.status_code == 400
    assert "This field is required." in response.content.decode()


# -- permissions and CSRF ------------------------------------------------------------------


def test_a_view_only_user_gets_403(admin_client, django_user_model, rules):
    token = token_of(preview(admin_client, FILE))
    client = staff(django_user_model, "view_rule")
    assert client.get(IMPORT).status_code == 403
    assert client.post(IMPORT, {"file": upload("rules.yaml", FILE)}).status_code == 403
    assert client.post(IMPORT, {"token": token}).status_code == 403
    assert "Import rules" not in client.get(CHANGELIST).content.decode()
    assert table()["login"][1] == 5


def test_a_user_who_may_not_add_or_delete_sees_why_and_no_apply(django_user_model, rules):
    client = staff(django_user_model, "view_rule", "change_rule", *OVERRIDE_PERMISSIONS)
    response = preview(client, FILE, prune=True)
    html = response.content.decode()
    assert "The file creates rules, and you may not add rules." in html
    assert "The file deletes rules (prune), and you may not delete rules." in html
    assert 'name="token"' not in html
    # A file that only changes rules is theirs to apply.
    only_change = FILE.split("  - name: search")[0]
    client.post(IMPORT, {"token": token_of(preview(client, only_change))})
    assert table()["login"][1] == 10


OVERRIDE_PERMISSIONS = ("add_override", "change_override", "delete_override")
RULE_PERMISSIONS = ("view_rule", "add_rule", "change_rule", "delete_rule")
REPLACES = (
    "The file replaces the overrides of rules, which takes the permissions to add, change and "
    "delete overrides."
)


def grant(client: Client, *codenames: str) -> None:
    user = client.get(CHANGELIST).wsgi_request.user
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))


def test_replacing_a_rules_overrides_takes_the_override_permissions(django_user_model, rules):
    """The file gives login an exempt override: a user who may edit rules but not overrides
    sees why and no Apply, and a preview applied after he lost them writes nothing."""
    client = staff(django_user_model, *RULE_PERMISSIONS)
    response = preview(client, FILE)
    html = response.content.decode()
    assert REPLACES in html and 'name="token"' not in html
    for missing in OVERRIDE_PERMISSIONS:  # each of the three is needed
        grant(client, *RULE_PERMISSIONS, *(p for p in OVERRIDE_PERMISSIONS if p != missing))
        assert REPLACES in preview(client, FILE).content.decode()

    grant(client, *RULE_PERMISSIONS, *OVERRIDE_PERMISSIONS)
    token = token_of(preview(client, FILE))
    grant(client, *RULE_PERMISSIONS)
    before = table()
    refused = client.post(IMPORT, {"token": token})
    assert refused.status_code == 200
    html = refused.content.decode()
    assert REPLACES in html and 'name="token"' not in html
    assert "The rules changed since the preview" not in html
    assert table() == before and not Override.objects.filter(rule=rules["login"]).exists()
    assert not LogEntry.objects.exists()

    grant(client, *RULE_PERMISSIONS, *OVERRIDE_PERMISSIONS)
    assert client.post(IMPORT, {"token": token}).status_code == 302
    assert table()["login"][4] == ["ip:203.0.113.7"]


def test_creating_rules_with_overrides_takes_add_and_deleting_them_delete(django_user_model, rules):
    client = staff(django_user_model, *RULE_PERMISSIONS)
    created = "rules:\n  - name: new\n    scope: new\n    limit: 3\n    overrides:\n" + (
        '      - {key: "user:7", limit: 9}\n'
    )
    html = preview(client, created).content.decode()
    assert "The file creates rules with overrides, and you may not add overrides." in html
    assert 'name="token"' not in html
    # Prune deletes api, which has an override: the admin's delete page asks for delete too.
    kept = export(client, rules["login"], rules["old"]).content.decode()
    html = preview(client, kept, prune=True).content.decode()
    assert (
        "The file deletes rules that have overrides (prune), and you may not delete overrides."
    ) in html
    assert 'name="token"' not in html

    grant(client, *RULE_PERMISSIONS, "add_override", "delete_override")
    client.post(IMPORT, {"token": token_of(preview(client, created))})
    assert table()["new"][4] == ["user:7"]
    client.post(IMPORT, {"token": token_of(preview(client, kept, prune=True))})
    assert set(table()) == {"login", "old"}


def test_the_import_page_needs_the_csrf_token(django_user_model, rules, admin_user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.post(IMPORT, {"file": upload("rules.yaml", FILE)}).status_code == 403
    page = client.get(IMPORT)
    csrf = page.cookies["csrftoken"].value
    response = client.post(
        IMPORT, {"file": upload("rules.yaml", FILE), "csrfmiddlewaretoken": csrf}
    )
    assert response.status_code == 200
    token = token_of(response)
    assert client.post(IMPORT, {"token": token}).status_code == 403
    assert table()["login"][1] == 5
    client.post(IMPORT, {"token": token, "csrfmiddlewaretoken": csrf})
    assert table()["login"][1] == 10


# -- the rule form, compact --------------------------------------------------------------------


def test_the_rule_form_has_no_full_height_group_pickers(admin_client):
    response = admin_client.get(ADD)
    form = response.context["adminform"].form
    for name in ("groups", "exempt_groups"):
        widget = form.fields[name].widget.widget  # inside the related-object wrapper
        assert type(widget).__name__ == "SelectMultiple"  # not FilteredSelectMultiple
        assert widget.attrs["size"] == "4" and widget.attrs["class"] == "throttle-compact"
    assert form.fields["groups"].widget.widget.attrs["data-throttle-when"] == "applies_to=groups"
    assert form.fields["key_arg"].widget.attrs["data-throttle-when"] == (
        "key_kind=custom,header,param"
    )
    assert form.fields["burst"].widget.attrs["data-throttle-when"] == (
        "algorithm=leaky_bucket,token_bucket"
    )
    assert form.fields["exempt_networks"].widget.attrs["rows"] == 2
    html = response.content.decode()
    assert "selectfilter" not in html and "SelectFilter2.js" not in html
    assert "django_throttle/rule_form.js" in html
    # The behaviour of a new rule is its defaults: folded.
    classes = {fs.name: fs.classes for fs in response.context["adminform"]}
    assert "collapse" in classes["Behaviour"]


def test_behaviour_set_away_from_its_defaults_stays_open(admin_client, rules):
    rules["login"].block_seconds = 60
    rules["login"].save()
    response = admin_client.get(f"{CHANGELIST}{rules['login'].pk}/change/")
    classes = {fs.name: fs.classes for fs in response.context["adminform"]}
    assert "collapse" not in classes["Behaviour"]
    response = admin_client.get(f"{CHANGELIST}{rules['old'].pk}/change/")
    classes = {fs.name: fs.classes for fs in response.context["adminform"]}
    assert "collapse" in classes["Behaviour"]


def test_the_compact_form_still_saves_groups(admin_client):
    members, exempt = Group.objects.create(name="members"), Group.objects.create(name="vip")
    response = admin_client.post(
        ADD,
        form_data(
            applies_to="groups",
            groups=[str(members.pk)],
            exempt_groups=[str(exempt.pk)],
            block_seconds="30",
        ),
    )
    assert response.status_code == 302
    rule = Rule.objects.get(name="login")
    assert list(rule.groups.all()) == [members]
    assert list(rule.exempt_groups.all()) == [exempt]
    assert rule.block_seconds == 30


# -- in a real browser ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_import_and_the_rule_form_in_a_real_browser(
    django_db_setup, live_server, django_user_model, tmp_path
):
    # django_db_setup first: a live server started before the test database exists sees
    # SQLite's ":memory:" and shares the test's one connection between its request threads,
    # which crashes the interpreter when two requests query at once.
    from tests.test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, require_browser

    require_browser()
    from playwright.sync_api import sync_playwright

    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    Rule.objects.create(name="login", scope="login", methods="POST", limit=5, per=15)
    Rule.objects.create(name="old", scope="/old/", limit=1)
    Group.objects.create(name="partners")
    path = tmp_path / "rules.yaml"
    path.write_text(FILE)
    ARTIFACTS.mkdir(exist_ok=True)

    # Only the browser inside this block: Django refuses queries on Playwright's event loop.
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{live_server.url}/admin/login/?next={CHANGELIST}")
            page.fill("#id_username", "admin")
            page.fill("#id_password", "pw")
            page.click("input[type=submit]")
            page.wait_for_url(f"**{CHANGELIST}")

            # The changelist's button, the upload, the diff.
            page.click("a.throttle-import-link")
            page.wait_for_url(f"**{IMPORT}")
            page.set_input_files("#id_file", str(path))
            page.check("#id_prune")
            page.click("input[name=_preview]")
            page.wait_for_selector("#throttle-import-changed")
            assert page.locator("#throttle-import-created tr[data-rule=search]").count() == 1
            limit = page.locator("#throttle-import-changed tr[data-rule=login]").filter(
                has_text="Limit"
            )
            assert limit.locator("td.old").inner_text() == "5"
            assert limit.locator("td.new").inner_text() == "10"
            assert page.locator("#throttle-import-deleted tr[data-rule=old]").count() == 1
            page.screenshot(path=str(ARTIFACTS / "rule-import.png"), full_page=True)
            page.click("input[name=_apply]")
            page.wait_for_url(f"**{CHANGELIST}")
            assert "Imported rules.yaml: 1 rule created, 1 changed, 1 deleted" in (
                page.inner_text(".messagelist")
            )

            # The rule form: the groups only for "members of the chosen groups", the key
            # argument only for keys that take one, the burst only for buckets.
            page.goto(f"{live_server.url}{ADD}")
            groups, key_arg, burst = (
                page.locator(f".form-row.field-{name}") for name in ("groups", "key_arg", "burst")
            )
            assert not groups.is_visible() and not key_arg.is_visible()
            assert not burst.is_visible()
            exempt = page.locator("#id_exempt_groups").bounding_box()
            assert exempt is not None and exempt["height"] < 120  # not the 350 px picker
            assert not page.locator("fieldset.collapse details[open]").count()  # Behaviour folded
            page.screenshot(path=str(ARTIFACTS / "rule-form.png"), full_page=True)
            page.select_option("#id_applies_to", "groups")
            page.select_option("#id_key_kind", "header")
            page.select_option("#id_algorithm", "token_bucket")
            assert groups.is_visible() and key_arg.is_visible() and burst.is_visible()
            page.fill("#id_name", "members")
            page.fill("#id_scope", "/members/")
            page.fill("#id_key_arg", "X-Api-Key")
            page.fill("#id_limit", "5")
            page.select_option("#id_groups", label="partners")
            page.click("input[name=_save]")
            page.wait_for_url(f"**{CHANGELIST}")
        finally:
            browser.close()

    assert set(Rule.objects.values_list("name", flat=True)) == {"login", "members", "search"}
    assert Rule.objects.get(name="login").limit == 10
    assert [g.name for g in Rule.objects.get(name="members").groups.all()] == ["partners"]
    assert LogEntry.objects.filter(action_flag=DELETION, object_repr__startswith="old:").exists()


# -- round trips ---------------------------------------------------------------------------


def saved_through_the_admin(client: Client) -> Rule:
    """A rule typed as people type it: networks one per line (a browser sends CRLF), host bits
    and upper case in them, spaces and mixed case around methods, statuses, scope and keys."""
    partners = Group.objects.create(name="partners")
    response = client.post(
        ADD,
        form_data(
            name="api",
            scope=" /api/ ",
            methods=" get , Post,GET",
            count_statuses=" 4XX , 429,,429 ",
            key_kind="header",
            key_arg=" X-Api-Key ",
            algorithm="token_bucket",
            burst="20",
            exempt_networks="10.0.0.0/8\r\n192.168.1.7/16\r\n\r\n2001:DB8::/32\n 172.16.0.0/12 ",
            exempt_groups=[str(partners.pk)],
            **{
                "overrides-TOTAL_FORMS": "2",
                "overrides-0-key": " ip:2001:DB8::1 ",
                "overrides-0-limit": "50",
                "overrides-0-expires_at_0": "2030-01-02",
                "overrides-0-expires_at_1": "03:04:05",
                "overrides-1-key": "header:abc ",
                "overrides-1-exempt": "on",
            },
        ),
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    return Rule.objects.get(name="api")


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_an_export_of_what_the_admin_saved_imports_unchanged(
    admin_client: Client, fmt: str, monkeypatch: Any
) -> None:
    rule = saved_through_the_admin(admin_client)
    if fmt == "json":
        monkeypatch.setitem(sys.modules, "yaml", None)  # the action then writes JSON
    exported = export(admin_client, rule).content.decode()
    monkeypatch.undo()
    response = preview(admin_client, exported, name=f"rules.{fmt}")
    assert response.context["nothing"] is True, response.context["changed"]
    assert import_rules(load(exported, fmt), prune=False, dry_run=True).lines() == ["unchanged api"]


def test_a_row_stored_in_another_spelling_imports_unchanged(admin_client: Client) -> None:
    # As earlier versions stored what the admin was given.
    rule = saved_through_the_admin(admin_client)
    Rule.objects.filter(pk=rule.pk).update(exempt_networks="10.0.0.0/8\n192.168.0.0/16")
    exported = export(admin_client, rule).content.decode()
    plan = import_rules(load(exported, "yaml"), prune=False, dry_run=False)
    assert plan.lines() == ["unchanged api"]
    assert Rule.objects.get(pk=rule.pk).exempt_networks == "10.0.0.0/8\n192.168.0.0/16"


# -- two admins applying at once -------------------------------------------------------------

ROUNDS = 6


def apply_at_once(tokens: list[tuple[Client, str]]) -> list[Any]:
    """Each client POSTs its token in a thread of its own (its own database connection), all
    released together; the responses, or the exceptions they raised."""
    from django.db import connections

    barrier = threading.Barrier(len(tokens))
    results: list[Any] = [None] * len(tokens)

    def apply(index: int, client: Client, token: str) -> None:
        try:
            barrier.wait()
            results[index] = client.post(IMPORT, {"token": token})
        except Exception as exc:  # a 500, raised by the test client
            results[index] = exc
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=apply, args=(i, client, token))
        for i, (client, token) in enumerate(tokens)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.django_db(transaction=True)
def test_two_admins_applying_at_once_get_one_import_and_one_new_preview(django_user_model):
    """Two previews of files that both create 'search' and change 'login', applied at the same
    moment by two admins: one is written, the other is shown again with the notice that the
    rules changed (never a 500: a unique name twice on PostgreSQL, "database is locked" on
    SQLite), round after round."""
    admins = []
    for name in ("ada", "bob"):
        user = django_user_model.objects.create_superuser(name, f"{name}@example.com", "pw")
        client = Client(raise_request_exception=True)
        client.force_login(user)
        admins.append(client)
    other = FILE.replace("limit: 10", "limit: 11").replace("limit: 30", "limit: 31")
    for round_number in range(ROUNDS):
        Rule.objects.all().delete()
        Rule.objects.create(name="login", scope="login", methods="POST", limit=5, per=15)
        tokens = [
            (admins[0], token_of(preview(admins[0], FILE))),
            (admins[1], token_of(preview(admins[1], other))),
        ]
        results = apply_at_once(tokens)
        failures = [r for r in results if isinstance(r, Exception)]
        assert not failures, f"round {round_number}: {failures!r}"
        statuses = sorted(r.status_code for r in results)
        assert statuses == [200, 302], f"round {round_number}: {statuses}"
        (again,) = [r for r in results if r.status_code == 200]
        assert "The rules changed since the preview" in again.content.decode()
        written = 10 if results[0].status_code == 302 else 11
        assert table()["login"][1] == written and table()["search"][1] == written + 20
