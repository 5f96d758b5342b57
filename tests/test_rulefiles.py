"""Rules as files: throttle_export and throttle_import, YAML and JSON, one format."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_throttle.models import Override, Rule
from tests.helpers import rule

pytestmark = pytest.mark.django_db

DOCUMENTED = """
rules:
  - name: api
    scope: /api/
    key_kind: ip
    limit: 100
    per: 15
    unit: minute
    algorithm: sliding_window_counter
    exempt_networks: ["10.0.0.0/8"]
    groups: []
    overrides:
      - {key: "user:42", limit: 1000}
      - {key: "ip:203.0.113.7", exempt: true}
  - name: login
    scope: login
    methods: POST
    limit: 5
    per: 15
    block_seconds: 3600
    fail_mode: closed
"""


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_the_documented_example_imports(tmp_path: Path) -> None:
    out = run("throttle_import", write(tmp_path, "rules.yaml", DOCUMENTED))
    assert out.split("\n")[:2] == ["create api", "create login"]
    api = Rule.objects.get(name="api")
    assert (api.limit, api.per, api.unit, api.exempt_networks) == (100, 15, "minute", "10.0.0.0/8")
    assert sorted(api.overrides.values_list("key", "limit", "exempt")) == [
        ("ip:203.0.113.7", None, True),
        ("user:42", 1000, False),
    ]
    login = Rule.objects.get(name="login")
    assert (login.block_seconds, login.fail_mode, login.algorithm) == (
        3600,
        "closed",
        "sliding_window_counter",
    )


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_export_then_import_is_a_round_trip(tmp_path: Path, fmt: str) -> None:
    partners = Group.objects.create(name="partners")
    api = rule("api", "/api/", 100, per=15, exempt_networks="10.0.0.0/8, 2001:db8::/32")
    api.exempt_groups.set([partners])
    Override.objects.create(rule=api, key="user:42", limit=1000)
    rule("login", "login", 5, block_seconds=3600, applies_to="anonymous")
    exported = run("throttle_export", "--format", fmt)
    data = json.loads(exported) if fmt == "json" else yaml.safe_load(exported)
    assert [r["name"] for r in data["rules"]] == ["api", "login"]
    assert data["rules"][0]["exempt_groups"] == ["partners"]
    assert data["rules"][0]["exempt_networks"] == ["10.0.0.0/8", "2001:db8::/32"]
    Rule.objects.all().delete()
    path = write(tmp_path, f"rules.{fmt}", exported)
    assert run("throttle_import", path).split() == ["create", "api", "create", "login"]
    assert run("throttle_export", "--format", fmt) == exported  # the same rules again
    # Idempotent: importing the same file changes nothing.
    assert run("throttle_import", path).split() == ["unchanged", "api", "unchanged", "login"]


def test_dry_run_prints_what_would_change_and_writes_nothing(tmp_path: Path) -> None:
    rule("api", "/api/", 10)
    rule("old", "/old/", 10)
    path = write(tmp_path, "rules.yaml", DOCUMENTED)
    out = run("throttle_import", path, "--dry-run", "--prune")
    assert out.splitlines() == [
        "would create login",
        "would change api: limit, per, exempt_networks, overrides",
        "would delete old",
    ]
    assert sorted(Rule.objects.values_list("name", "limit")) == [("api", 10), ("old", 10)]


def test_a_dry_run_lists_the_unchanged_rules_as_unchanged(tmp_path: Path) -> None:
    path = write(tmp_path, "rules.yaml", DOCUMENTED)
    run("throttle_import", path)
    out = run("throttle_import", path, "--dry-run")
    assert out.splitlines() == ["unchanged api", "unchanged login"]  # not "would unchanged"


def test_a_refusal_is_one_sentence_with_one_full_stop(tmp_path: Path) -> None:
    entry = {"name": "c", "scope": "/c/", "limit": 5, "algorithm": "concurrency"}
    path = write(
        tmp_path, "rules.json", json.dumps({"rules": [{**entry, "count_statuses": "401"}]})
    )
    with pytest.raises(CommandError) as refused:
        run("throttle_import", path)
    assert str(refused.value) == (
        f"{path}: rule 'c': count_statuses: A concurrency rule counts every request in flight, "
        "whatever its status: leave this empty; nothing was written."
    )


def test_prune_deletes_the_rules_the_file_does_not_name(tmp_path: Path) -> None:
    rule("old", "/old/", 10)
    run("throttle_import", write(tmp_path, "rules.yaml", DOCUMENTED), "--prune")
    assert sorted(Rule.objects.values_list("name", flat=True)) == ["api", "login"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "bad", "scope": "/x/", "limit": 0}, "rule 'bad': limit"),
        ({"name": "bad", "scope": "^(unclosed", "limit": 5}, "rule 'bad': scope"),
        ({"name": "bad", "scope": r"^/(?=admin)", "limit": 5}, "rule 'bad': scope"),
        (
            {"name": "bad", "scope": "/x/", "limit": 5, "colour": "red"},
            r"unknown field\(s\) colour",
        ),
        ({"name": "bad", "scope": "/x/", "limit": 5, "groups": ["nobody"]}, "no group nobody"),
        (
            {"name": "bad", "scope": "/x/", "limit": 5, "overrides": [{"key": "user:1"}]},
            "override 'user:1'",
        ),
        ({"name": "bad", "scope": "/x/", "limit": 5, "per": 1.5}, "per: a whole number"),
        ({"name": "bad", "scope": "/x/", "limit": True}, "limit: a whole number"),
        ({"name": "bad", "scope": "/x/", "limit": 5, "enabled": "no"}, "enabled: true or false"),
        ({"name": "bad", "scope": "/x/", "limit": 5, "groups": ["x", 5]}, "list of group names"),
        (
            {
                "name": "bad",
                "scope": "/x/",
                "limit": 5,
                "overrides": [{"key": "u:1", "exempt": "false"}],
            },
            "an override is",
        ),
        ({"name": "bad", "scope": "/x/", "limit": 5, "per": 20000, "unit": "day"}, "per"),
    ],
)
def test_an_invalid_rule_changes_nothing_and_names_the_rule(
    tmp_path: Path, entry: dict[str, Any], message: str
) -> None:
    rule("keep", "/keep/", 7)
    good = {"name": "good", "scope": "/good/", "limit": 3}
    path = write(tmp_path, "rules.json", json.dumps({"rules": [good, entry]}))
    with pytest.raises(CommandError, match=message) as refused:
        run("throttle_import", path, "--prune")
    assert "nothing was written" in str(refused.value)
    assert list(Rule.objects.values_list("name", "limit")) == [("keep", 7)]


def test_an_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="cannot be read as YAML"):
        run("throttle_import", write(tmp_path, "rules.yaml", "rules: [unclosed"))
    with pytest.raises(CommandError, match='list under "rules"'):
        run("throttle_import", write(tmp_path, "rules.json", "{}"))
    with pytest.raises(CommandError, match="Cannot read"):
        run("throttle_import", str(tmp_path / "missing.yaml"))


# -- many rules: a bounded number of queries ------------------------------------------


def many(n: int, limit: int = 5) -> dict[str, Any]:
    """``n`` rules, every tenth with groups and overrides."""
    rules: list[dict[str, Any]] = []
    for i in range(n):
        entry: dict[str, Any] = {"name": f"r{i}", "scope": f"/r{i}/", "limit": limit}
        if i % 10 == 0:
            entry["groups"] = ["partners"]
            entry["exempt_groups"] = ["staff"]
            entry["overrides"] = [
                {"key": f"user:{i}", "limit": 50},
                {"key": "global", "exempt": True},
            ]
        rules.append(entry)
    return {"rules": rules}


def writes(queries: Any) -> list[str]:
    verbs = ("INSERT", "UPDATE", "DELETE")
    return [
        q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith(verbs)
    ]


def test_an_import_of_many_rules_takes_a_bounded_number_of_queries(tmp_path: Path) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    Group.objects.create(name="partners")
    Group.objects.create(name="staff")
    path = write(tmp_path, "rules.json", json.dumps(many(400)))
    with CaptureQueriesContext(connection) as fresh:
        run("throttle_import", path)
    assert Rule.objects.count() == 400
    assert Override.objects.count() == 80
    assert Rule.objects.get(name="r10").groups.get().name == "partners"
    # A few reads, then inserts of many rows each (SQLite takes 999 parameters a query).
    assert len(fresh.captured_queries) <= 30

    # A file that changes every rule: one bulk update, not one per rule.
    path = write(tmp_path, "rules.json", json.dumps(many(400, limit=6)))
    with CaptureQueriesContext(connection) as changed:
        out = run("throttle_import", path)
    assert out.count("change ") == 400
    assert set(Rule.objects.values_list("limit", flat=True)) == {6}
    assert len(changed.captured_queries) <= 60


def test_an_unchanged_import_and_a_dry_run_write_nothing(tmp_path: Path) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    Group.objects.create(name="partners")
    Group.objects.create(name="staff")
    path = write(tmp_path, "rules.json", json.dumps(many(200)))
    run("throttle_import", path)
    updated = dict(Rule.objects.values_list("name", "updated_at"))
    with CaptureQueriesContext(connection) as again:
        out = run("throttle_import", path)
    assert out.split().count("unchanged") == 200
    assert writes(again) == [] and len(again.captured_queries) <= 10
    assert dict(Rule.objects.values_list("name", "updated_at")) == updated

    changed = write(tmp_path, "changed.json", json.dumps(many(300, limit=7)))
    with CaptureQueriesContext(connection) as dry:
        out = run("throttle_import", changed, "--dry-run", "--prune")
    assert out.count("would change ") == 200 and out.count("would create ") == 100
    assert writes(dry) == [] and len(dry.captured_queries) <= 10
    assert dict(Rule.objects.values_list("name", "updated_at")) == updated


def test_an_override_given_twice_is_refused(tmp_path: Path) -> None:
    entry = {
        "name": "api",
        "scope": "/api/",
        "limit": 5,
        "overrides": [
            {"key": "ip:203.0.113.7", "limit": 9},
            {"key": " ip:203.0.113.7", "exempt": True},
        ],
    }
    path = write(tmp_path, "rules.json", json.dumps({"rules": [entry]}))
    with pytest.raises(CommandError, match="override ' ip:203.0.113.7'"):
        run("throttle_import", path)
    assert not Rule.objects.exists()


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_an_overrides_expiry_goes_out_and_comes_back(tmp_path: Path, fmt: str) -> None:
    api = rule("api", "/api/", 100)
    ends = timezone.now().replace(microsecond=0) + timedelta(days=7)
    Override.objects.create(rule=api, key="user:42", limit=1000, expires_at=ends)
    Override.objects.create(rule=api, key="user:7", exempt=True)
    exported = run("throttle_export", "--format", fmt)
    data = json.loads(exported) if fmt == "json" else yaml.safe_load(exported)
    assert data["rules"][0]["overrides"] == [
        {"key": "user:42", "limit": 1000, "expires_at": ends.isoformat()},
        {"key": "user:7", "exempt": True},
    ]
    Override.objects.filter(key="user:42").update(expires_at=None)
    path = write(tmp_path, f"rules.{fmt}", exported)
    assert run("throttle_import", path).split() == ["change", "api:", "overrides"]
    assert Override.objects.get(key="user:42").expires_at == ends
    assert run("throttle_import", path).split() == ["unchanged", "api"]


def test_an_expiry_that_is_not_a_date_is_a_clear_error(tmp_path: Path) -> None:
    text = DOCUMENTED.replace("limit: 1000}", 'limit: 1000, expires_at: "next week"}')
    path = write(tmp_path, "rules.yaml", text)
    with pytest.raises(CommandError, match="'next week' is not a date and time"):
        run("throttle_import", path)
    assert not Rule.objects.exists()
