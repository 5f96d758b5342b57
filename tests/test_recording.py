"""The rejection log: counted in process memory, persisted in bulk, pruned."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import warnings
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_throttle import acheck, check
from django_throttle.models import Rejection
from django_throttle.rejection_log import (
    OVERFLOW_DISPLAY,
    OVERFLOW_KEY,
    RejectionLog,
    display_of,
    flush,
    prune,
    rejection_log,
    write,
)
from django_throttle.store import digest
from tests.helpers import clear_of_window_end, rule, run, statuses

pytestmark = pytest.mark.db_matters
DB = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent
MW = pytest.mark.usefixtures("throttle_middleware")


@pytest.fixture(autouse=True)
def one_minute() -> None:
    """Rejections are filed under the minute of their decision: a test's requests in one."""
    clear_of_window_end(60, 2)


def rows() -> list[tuple[str, str, str, int]]:
    """(rule, display, action, count) of every row, sorted."""
    return sorted(Rejection.objects.values_list("rule", "display", "action", "count"))


def totals() -> dict[tuple[str, str], int]:
    """Summed counts per (rule, action)."""
    out: dict[tuple[str, str], int] = {}
    for row in Rejection.objects.all():
        out[(row.rule, row.action)] = out.get((row.rule, row.action), 0) + row.count
    return out


def wait_for(condition: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "the condition did not become true in time"
        time.sleep(0.02)


# -- what is counted ------------------------------------------------------------------


@DB
@MW
def test_admitted_requests_are_not_recorded_and_start_no_thread(client):
    rule("api", "/api/", 5)
    assert statuses(client, "/api/items/", 5) == [200] * 5
    assert len(rejection_log()) == 0
    assert rejection_log().thread is None
    assert flush() == 0
    assert rows() == []


@DB
@MW
def test_rejections_are_counted_per_rule_client_and_action(client):
    rule("api", "/api/", 2)
    assert statuses(client, "/api/items/", 5, REMOTE_ADDR="203.0.113.7") == [200, 200] + [429] * 3
    assert statuses(client, "/api/items/", 3, REMOTE_ADDR="203.0.113.8") == [200, 200, 429]
    assert len(rejection_log()) == 2  # nothing written yet: counted in memory
    assert rows() == []

    assert flush() == 2
    assert rows() == [
        ("api", "ip:203.0.113.7", "reject", 3),
        ("api", "ip:203.0.113.8", "reject", 1),
    ]
    stored = Rejection.objects.get(display="ip:203.0.113.7")
    assert stored.key == digest("ip:203.0.113.7")  # as the store keys the client
    assert stored.minute.second == 0 and stored.minute.microsecond == 0
    assert len(rejection_log()) == 0


@DB
@MW
def test_a_rejection_counts_once_under_the_rejecting_rule(client):
    rule("tight", "/api/", 1)
    rule("loose", "*", 100)
    assert statuses(client, "/api/items/", 4) == [200, 429, 429, 429]
    flush()
    assert rows() == [("tight", "ip:127.0.0.1", "reject", 3)]


@DB
@MW
def test_would_be_rejections_of_a_log_rule_are_counted_as_shadow(client):
    rule("trial", "/api/", 1, action="log")
    assert statuses(client, "/api/items/", 4) == [200] * 4  # a log rule never blocks
    flush()
    assert rows() == [("trial", "ip:127.0.0.1", "shadow", 3)]


@DB
@MW
def test_fail_closed_503_is_counted_as_unavailable(client, redis_server):
    rule("accounts", r"^/users/", 2, fail_mode="closed")
    assert client.get("/users/1/").status_code == 200  # rules loaded while Redis is up
    redis_server.kill()
    try:
        assert statuses(client, "/users/1/", 2) == [503, 503]
    finally:
        redis_server.start()
    flush()
    assert rows() == [("accounts", "ip:127.0.0.1", "unavailable", 2)]


@DB
def test_check_api_rejections_are_counted():
    rule("failed-login", "failed-login", 1)
    request = partial(RequestFactory().post, "/login/", REMOTE_ADDR="198.51.100.4")
    assert [check(request(), "failed-login").allowed for _ in range(3)] == [True, False, False]
    assert not check(request(), "failed-login", dry_run=True).allowed  # a dry run counts nothing
    flush()
    assert rows() == [("failed-login", "ip:198.51.100.4", "reject", 2)]


@DB
def test_async_rejections_are_counted():
    rule("report", "report", 1)
    request = partial(RequestFactory().get, "/report/", REMOTE_ADDR="198.51.100.9")

    async def three_checks() -> list[bool]:
        return [(await acheck(request(), "report")).allowed for _ in range(3)]

    assert run(three_checks) == [True, False, False]
    flush()
    assert rows() == [("report", "ip:198.51.100.9", "reject", 2)]


@DB
@MW
def test_user_keys_are_recorded_as_the_app_keys_them(client, django_user_model):
    user = django_user_model.objects.create_user("alice", password="pw")
    client.force_login(user)
    rule("per-user", "/api/", 1, key_kind="user")
    assert statuses(client, "/api/items/", 2) == [200, 429]
    flush()
    assert rows() == [("per-user", f"user:{user.pk}", "reject", 1)]


# -- the display form ---------------------------------------------------------------------


def test_display_form_cuts_values_and_removes_invisible_characters():
    assert display_of("ip:203.0.113.7") == "ip:203.0.113.7"
    assert display_of("ip:2001:db8:1:2::/64") == "ip:2001:db8:1:2::/64"
    assert display_of("user:42") == "user:42"
    assert display_of("global") == "global"
    assert display_of("header:abc\x1b[31m\r\ndef\u202egh") == "header:abc[31mdef" + "gh"
    long = "k" * 500
    assert display_of("param:" + long) == "param:" + "k" * 64 + "\u2026"
    assert display_of("custom:" + long) == "custom:" + "k" * 64 + "\u2026"


@DB
@MW
def test_a_huge_header_value_is_stored_as_digest_and_a_short_display(client):
    rule("keys", "/api/", 1, key_kind="header", key_arg="X-Api-Key")
    secret = "s3cr3t-" + "x" * 4000
    assert statuses(client, "/api/items/", 2, HTTP_X_API_KEY=secret) == [200, 429]
    flush()
    (stored,) = Rejection.objects.all()
    assert stored.key == digest("header:" + secret)
    assert stored.display == "header:" + secret[:64] + "\u2026"
    assert secret not in str(list(Rejection.objects.values()))  # nowhere in full


# -- bounded cost -------------------------------------------------------------------------


@DB
def test_flood_of_10000_rejections_costs_no_query_and_a_bounded_number_to_persist(settings):
    # In-process counters keep the flood fast; the rules, read from the database, are re-checked
    # every RULES_REFRESH, here longer than the test, so every query counted is the recorder's.
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "BACKEND": "memory",
        "RULES_REFRESH": 600,
    }
    rule("flood", "flood", 1, unit="hour", algorithm="fixed_window")
    clear_of_window_end(60, 5)  # the flood's rejections in one minute: 4 entries, not 8
    # A request is counted once per rule: every attempt is a request of its own.
    clients = [partial(RequestFactory().get, "/", REMOTE_ADDR=f"192.0.2.{n}") for n in range(1, 5)]
    for request in clients:
        assert check(request(), "flood").allowed  # each client's one allowed request; rules loaded
    attempts = [clients[n % 4]() for n in range(10_000)]

    with CaptureQueriesContext(connection) as flood_queries:
        for attempt in attempts:
            assert not check(attempt, "flood").allowed
    assert len(flood_queries) == 0  # no database query per rejected request

    with CaptureQueriesContext(connection) as flush_queries:
        assert flush() == 4
    writes = [
        q["sql"] for q in flush_queries if not q["sql"].upper().startswith(("SAVEPOINT", "RELEASE"))
    ]
    # One bulk upsert of the rejections and one of the sizing's counts, one prune of each.
    assert len(writes) == 4, writes
    assert [w.split()[0].upper() for w in writes] == ["INSERT", "INSERT", "DELETE", "DELETE"]
    assert "sizingcount" in writes[1] and "sizingcount" in writes[3]
    assert totals() == {("flood", "reject"): 10_000}
    assert rows() == [("flood", f"ip:192.0.2.{n}", "reject", 2_500) for n in range(1, 5)]


@DB
def test_the_buffer_is_bounded_and_overflow_keeps_the_totals():
    log = RejectionLog(max_keys=5)
    now = time.time()
    try:
        for n in range(40):
            log.add("api", f"ip:192.0.2.{n % 20}", "reject", when=now)
        assert len(log) == 6  # five clients of their own, and "(other clients)"
        assert log.overflowed == 30
        log.flush()
    finally:
        log.discard()
    assert totals() == {("api", "reject"): 40}
    other = Rejection.objects.get(key=OVERFLOW_KEY)
    assert (other.display, other.count) == (OVERFLOW_DISPLAY, 30)


@DB
@pytest.mark.parametrize("upsert", [True, False], ids=["on-conflict", "read-modify-write"])
def test_each_flush_adds_to_the_rows_already_written(upsert):
    minute = int(time.time()) // 60 * 60
    first = {("api", digest("ip:192.0.2.1"), "reject", minute): [3, "ip:192.0.2.1"]}
    second = {
        ("api", digest("ip:192.0.2.1"), "reject", minute): [4, "ip:192.0.2.1"],
        ("api", digest("ip:192.0.2.2"), "reject", minute): [1, "ip:192.0.2.2"],
        ("api", digest("ip:192.0.2.1"), "shadow", minute): [2, "ip:192.0.2.1"],
    }
    write(first, upsert=upsert)
    write(second, upsert=upsert)  # as another process would, later
    assert rows() == [
        ("api", "ip:192.0.2.1", "reject", 7),
        ("api", "ip:192.0.2.1", "shadow", 2),
        ("api", "ip:192.0.2.2", "reject", 1),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_failed_flush_keeps_the_counts_for_the_next_one(caplog):
    rejection_log().add("api", "ip:192.0.2.1", "reject")
    rejection_log().add("api", "ip:192.0.2.1", "reject")
    table = connection.ops.quote_name(Rejection._meta.db_table)
    moved = connection.ops.quote_name(Rejection._meta.db_table + "_away")
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO {moved}")
    try:
        assert flush() == 0  # a real database error
        assert rejection_log().pending == 2
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {moved} RENAME TO {table}")
    assert "could not persist 1 rejection counts" in caplog.text
    assert flush() == 1
    assert rows() == [("api", "ip:192.0.2.1", "reject", 2)]


# -- the flusher thread and processes -----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_flusher_thread_persists_counts_within_flush_interval(settings):
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "FLUSH_INTERVAL": 0.2}
    rejection_log().add("api", "ip:192.0.2.1", "reject")
    assert rejection_log().thread is not None  # started by the first rejection
    wait_for(lambda: Rejection.objects.exists(), within=30)
    assert rows() == [("api", "ip:192.0.2.1", "reject", 1)]
    wait_for(lambda: rejection_log().thread is None, within=30)  # nothing left: it stops


def test_a_forked_child_starts_with_an_empty_buffer():
    rejection_log().add("api", "ip:192.0.2.1", "reject")
    assert len(rejection_log()) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, fork()": known
        pid = os.fork()
    if pid == 0:  # the child: the parent's counts are the parent's to write
        os._exit(0 if len(rejection_log()) == 0 and rejection_log().thread is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(rejection_log()) == 1  # the parent keeps its own


# Two OS processes serve requests on one SQLite file (the test database lives in this
# process's memory) and the harness's Redis; then one of them renders the dashboard.
SERVE = """
import json, sys, time, django
from django.conf import settings
settings.DATABASES["default"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}
settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "FLUSH_INTERVAL": 0.3, "TIMEOUT": 5.0}
settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django_throttle.middleware.ThrottleMiddleware"]
django.setup()
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django_throttle.models import Rule
if sys.argv[2] == "prepare":
    call_command("migrate", verbosity=0)
    Rule.objects.create(name="api", scope="/api/", limit=1, unit="hour", algorithm="fixed_window")
    get_user_model().objects.create_superuser("admin", "admin@example.com", "pw")
client = Client()
codes = [client.get("/api/items/", REMOTE_ADDR=ip).status_code for ip in sys.argv[3:]]
print(codes.count(429), flush=True)
for line in sys.stdin:  # stay up: the flusher thread, not the exit, must write the counts
    expected, within = line.split()
    client.force_login(get_user_model().objects.get(username="admin"))
    deadline = time.monotonic() + float(within)
    while True:
        data = client.get("/admin/django_throttle/dashboard/data/").json()
        if sum(t["total"] for t in data["totals"]) >= int(expected) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    page = client.get("/admin/django_throttle/dashboard/").content.decode()
    print(json.dumps({"data": data, "page": page}), flush=True)
"""


def serve(database: str, prepare: bool, *ips: str) -> subprocess.Popen[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    assert env["REDIS_URL"]  # the harness's server, shared by both processes
    return subprocess.Popen(
        [sys.executable, "-c", SERVE, database, "prepare" if prepare else "-", *ips],
        cwd=ROOT,
        env=env,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def stop(process: subprocess.Popen[str]) -> None:
    _, err = process.communicate("", timeout=60)  # end of input: it exits
    assert process.returncode == 0, err


@pytest.mark.slow
def test_counts_of_two_processes_reach_the_dashboard_within_the_flush_interval(tmp_path):
    database = str(tmp_path / "shared.sqlite3")
    shared = ["192.0.2.9"] * 5
    first = serve(database, True, *["192.0.2.1"] * 5, *shared)
    second = None
    try:
        assert first.stdout is not None
        rejected = int(first.stdout.readline())
        second = serve(database, False, *["192.0.2.2"] * 5, *shared)
        assert second.stdout is not None and second.stdin is not None
        rejected += int(second.stdout.readline())
        assert rejected == 4 + 4 + 9  # one admitted per client: Redis is shared

        # Neither process is asked to flush: each one's timer does, while it keeps running.
        second.stdin.write(f"{rejected} 60\n")
        second.stdin.flush()
        seen = json.loads(second.stdout.readline())
        assert first.poll() is None and second.poll() is None
    finally:
        stop(first)
        if second is not None:
            stop(second)

    data = seen["data"]
    assert data["totals"] == [
        {"rule": "api", "reject": rejected, "unavailable": 0, "shadow": 0, "total": rejected}
    ]
    top = {row["display"]: row["total"] for row in data["top_keys"]}
    assert top == {"ip:192.0.2.9": 9, "ip:192.0.2.1": 4, "ip:192.0.2.2": 4}  # 9: both added
    assert sum(data["series"][0]["counts"]) == rejected
    assert "ip:192.0.2.9" in seen["page"]  # the HTML dashboard shows it too
    assert 'class="throttle-chart"' in seen["page"]


# -- retention ----------------------------------------------------------------------------


def make_row(age: timedelta, display: str = "ip:192.0.2.1", count: int = 1) -> Rejection:
    minute = (timezone.now() - age).replace(second=0, microsecond=0)
    return Rejection.objects.create(
        rule="api",
        key=digest(display),
        display=display,
        action="reject",
        minute=minute,
        count=count,
    )


@DB
def test_prune_deletes_rows_older_than_retention_days(settings):
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "RETENTION_DAYS": 7}
    make_row(timedelta(days=8), "ip:192.0.2.8")
    make_row(timedelta(days=7, minutes=1), "ip:192.0.2.7")
    make_row(timedelta(days=6, hours=23), "ip:192.0.2.6")
    make_row(timedelta(minutes=1), "ip:192.0.2.0")
    assert prune() == 2
    assert sorted(Rejection.objects.values_list("display", flat=True)) == [
        "ip:192.0.2.0",
        "ip:192.0.2.6",
    ]


@DB
def test_throttle_prune_command_prunes_with_the_setting_or_days(settings):
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "RETENTION_DAYS": 30}
    make_row(timedelta(days=31), "ip:192.0.2.31")
    make_row(timedelta(days=3), "ip:192.0.2.3")
    make_row(timedelta(hours=1), "ip:192.0.2.0")
    out = io.StringIO()
    call_command("throttle_prune", stdout=out)
    assert "Deleted 1 rejection row" in out.getvalue()
    call_command("throttle_prune", "--days", "2", stdout=out)
    assert list(Rejection.objects.values_list("display", flat=True)) == ["ip:192.0.2.0"]


@DB
def test_the_flush_prunes_old_rows():
    make_row(timedelta(days=400), "ip:192.0.2.99")
    rejection_log().add("api", "ip:192.0.2.1", "reject")
    flush()
    assert rows() == [("api", "ip:192.0.2.1", "reject", 1)]


# -- management commands ------------------------------------------------------------------


@DB
def test_throttle_flush_command_persists_the_counts_of_its_process():
    rejection_log().add("api", "ip:192.0.2.1", "reject")
    rejection_log().add("api", "ip:192.0.2.1", "reject")
    out = io.StringIO()
    call_command("throttle_flush", stdout=out)
    assert "Flushed 1 rejection row(s)." in out.getvalue()
    assert rows() == [("api", "ip:192.0.2.1", "reject", 2)]


@DB
def test_throttle_status_shows_the_state_without_consuming():
    rule("login", "login", 3)
    request = partial(RequestFactory().post, "/login/", REMOTE_ADDR="198.51.100.4")
    check(request(), "login")
    out = io.StringIO()
    call_command("throttle_status", "login", "ip:198.51.100.4", stdout=out)
    call_command("throttle_status", "login", "ip:198.51.100.4", stdout=out)
    text = out.getvalue()
    assert text.count("login: 2 of 3 remaining") == 2  # reading twice consumed nothing
    assert check(request(), "login", dry_run=True).remaining == 2


@DB
def test_throttle_reset_command_resets_the_key_under_every_rule_of_the_scope():
    rule("login", "login", 1)
    rule("login-daily", "login", 5, unit="day")
    request = partial(RequestFactory().post, "/login/", REMOTE_ADDR="198.51.100.4")
    assert [check(request(), "login").allowed for _ in range(2)] == [True, False]
    out = io.StringIO()
    call_command("throttle_reset", "login", "ip:198.51.100.4", stdout=out)
    assert "under 2 rules" in out.getvalue()
    decision = check(request(), "login", dry_run=True)
    assert decision.allowed
    assert decision.remaining == 1


@DB
def test_throttle_status_and_reset_refuse_an_unknown_scope():
    from django.core.management import CommandError

    for command in ("throttle_status", "throttle_reset"):
        with pytest.raises(CommandError, match="No rule"):
            call_command(command, "nope", "ip:198.51.100.4")


@DB
def test_throttle_status_applies_a_client_s_override(django_capture_on_commit_callbacks):
    from django_throttle.models import Override

    login = rule("login", "login", 3)
    with django_capture_on_commit_callbacks(execute=True):
        Override.objects.create(rule=login, key="ip:198.51.100.4", limit=9)
        Override.objects.create(rule=login, key="ip:198.51.100.5", exempt=True)
    out = io.StringIO()
    call_command("throttle_status", "login", "ip:198.51.100.4", stdout=out)
    call_command("throttle_status", "login", "ip:198.51.100.5", stdout=out)
    assert out.getvalue().splitlines()[0].startswith("login: 9 of 9 remaining")
    assert out.getvalue().splitlines()[1] == "login: this client is exempt (an override)"
