"""Invalid rows never break requests, and regular-expression scopes cannot stall a worker.

However a rule reached the table (QuerySet.update(), loaddata, raw SQL), an enabled rule that
cannot be compiled is skipped with one logged error and shown as broken in the admin; the
other rules keep loading and changing. update() and loaddata validate like save()."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import connection

from django_throttle.models import Rule
from django_throttle.patterns import UnsafePattern, check_pattern
from django_throttle.rules import rules_changed
from tests.helpers import rule, statuses

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

CHANGELIST = "/admin/django_throttle/rule/"
STAMPS = {
    "created_at": "2026-12-01T00:00:00Z",
    "updated_at": "2026-12-01T00:00:00Z",
}  # as dumpdata writes

BAD_VALUES = [
    ("scope", "^(unclosed"),
    ("scope", r"^/(?=admin)"),  # a lookaround: RE2 cannot run it
    ("limit", 0),
    ("limit", -5),
    ("algorithm", "quantum"),
    ("unit", "fortnight"),
    ("burst", 0),
    ("action", "explode"),
]


def write_with_sql(pk: int, field: str, value: Any) -> None:
    with connection.cursor() as cursor:
        column = connection.ops.quote_name(field)
        cursor.execute(f"UPDATE django_throttle_rule SET {column} = %s WHERE id = %s", [value, pk])


@pytest.mark.parametrize(("field", "value"), BAD_VALUES)
def test_a_row_broken_with_sql_never_breaks_a_request(
    client: Any, caplog: Any, django_capture_on_commit_callbacks: Any, field: str, value: Any
) -> None:
    capture_on_commit = django_capture_on_commit_callbacks
    good = rule("api", "/api/", 2, algorithm="fixed_window")
    broken = rule("other", "/api/", 100, algorithm="token_bucket")
    write_with_sql(broken.pk, field, value)
    rules_changed()  # SQL announces nothing; any later change would load it
    with caplog.at_level(logging.ERROR, logger="django_throttle"):
        assert statuses(client, "/api/items/", 3) == [200, 200, 429]
    skipped = [r for r in caplog.records if "cannot be enforced" in r.getMessage()]
    assert len(skipped) == 1 and skipped[0].args == ("other",)
    # Later changes still load: the good rule's new limit applies at once.
    good.limit = 4
    with capture_on_commit(execute=True):
        good.save()
    assert statuses(client, "/api/items/", 3) == [200, 200, 429]  # 2 counted before, 4 allowed


@pytest.mark.parametrize(("field", "value"), BAD_VALUES[:3])
def test_the_admin_list_shows_a_broken_rule(admin_client: Any, field: str, value: Any) -> None:
    broken = rule("broken-one", "/api/", 100, algorithm="token_bucket")
    rule("fine-one", "/x/", 5)
    write_with_sql(broken.pk, field, value)
    html = admin_client.get(CHANGELIST).content.decode()
    assert html.count("broken:") == 1
    assert "broken-one" in html.split("broken:")[0].rsplit("<tr", 1)[1]


@pytest.mark.parametrize(("field", "value"), BAD_VALUES[:3])
def test_update_that_would_break_an_enabled_rule_is_refused(field: str, value: Any) -> None:
    created = rule("api", "/api/", 5)
    with pytest.raises(ValidationError, match="api"):
        Rule.objects.filter(pk=created.pk).update(**{field: value})
    created.refresh_from_db()
    assert getattr(created, field) != value  # rolled back


def test_update_may_disable_a_broken_rule(admin_client: Any) -> None:
    broken = rule("broken", "/api/", 5)
    write_with_sql(broken.pk, "scope", "^(unclosed")
    assert Rule.objects.filter(pk=broken.pk).update(enabled=False) == 1
    # ... and the admin's "enable" action refuses it with a message, not a 500.
    response = admin_client.post(
        CHANGELIST,
        {"action": "enable_rules", "_selected_action": [broken.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert "Invalid regular expression" in response.content.decode()
    broken.refresh_from_db()
    assert not broken.enabled


@pytest.mark.parametrize(("field", "value"), BAD_VALUES[:3])
def test_loaddata_refuses_an_invalid_enabled_rule(tmp_path: Path, field: str, value: Any) -> None:
    fields = {"name": "loaded", "scope": "/api/", "limit": 5, "unit": "minute", **STAMPS}
    fields[field] = value
    fixture = tmp_path / "rules.json"
    fixture.write_text(json.dumps([{"model": "django_throttle.rule", "fields": fields}]))
    with pytest.raises(Exception, match="loaded"):
        call_command("loaddata", str(fixture), verbosity=0)
    assert not Rule.objects.filter(name="loaded").exists()


def test_loaddata_takes_a_valid_rule(tmp_path: Path) -> None:
    fixture = tmp_path / "rules.json"
    fields = {"name": "loaded", "scope": r"^/users/\d+/$", "limit": 5, "unit": "minute", **STAMPS}
    fixture.write_text(json.dumps([{"model": "django_throttle.rule", "fields": fields}]))
    call_command("loaddata", str(fixture), verbosity=0)
    assert Rule.objects.get(name="loaded").limit == 5


# -- regular-expression scopes -------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern",
    [
        r"^/(?=admin)",  # a lookaround: not in RE2
        r"^/(\w)\1$",  # a backreference: not in RE2
        r"^/(\w{30}){30}",  # a program too large for RE2's memory bound
    ],
)
def test_patterns_re2_cannot_run_are_refused(pattern: str) -> None:
    with pytest.raises(UnsafePattern):
        check_pattern(pattern)
    with pytest.raises(ValidationError, match="regular expression"):
        Rule(name="r", scope=pattern, limit=5).full_clean()


@pytest.mark.parametrize(
    "pattern",
    [
        r"^/users/\d+/$",
        r"^/api/v\d+/orders/[^/]+/$",
        r"^/(ab)+/$",
        r"^/x{2,5}$",
        r"^/files/.+\.pdf$",
    ],
)
def test_usual_patterns_are_accepted(pattern: str) -> None:
    check_pattern(pattern)
    Rule(name="r", scope=pattern, limit=5).full_clean()


def test_a_hostile_path_against_a_regex_scope_is_answered(client: Any) -> None:
    """A 50,000-character path that almost matches: RE2 answers in time linear in its length
    (tests/test_patterns_linear.py holds the backtracking shapes)."""
    rule("users", r"^/users/\d+\d+/$", 1)
    hostile = "/users/" + "1" * 50_000 + "x"
    assert client.get(hostile).status_code == 404  # no such page, and no stall on the way
    assert statuses(client, "/users/12/", 2) == [200, 429]
