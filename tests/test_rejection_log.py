"""The rejection log cannot be poisoned or outgrown, and sees the counts of every process.

Any identity is stored or safely replaced and a row the database refuses never holds back the
others; a period keeps a bounded number of clients by name, old minutes are merged into
quarter hours and two hours; counts handed to Redis by any process reach the dashboard and
``throttle_flush`` without that process flushing; Redis down loses nothing.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection
from django.test import RequestFactory
from django.utils import timezone

from django_throttle import check
from django_throttle.dashboard.queries import dashboard_data
from django_throttle.models import Rejection
from django_throttle.rejection_log import (
    NAMED_PER_PERIOD,
    NAMED_PER_RULE,
    OVERFLOW_DISPLAY,
    OVERFLOW_KEY,
    RejectionLog,
    collect,
    compact,
    display_of,
    flush,
    rejection_log,
    write_each,
)
from django_throttle.rejection_log.through_redis import counts_key, named_key
from django_throttle.store import digest
from tests.helpers import rule

pytestmark = pytest.mark.db_matters
DB = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent
DATA = "/admin/django_throttle/dashboard/data/"


def json_client(request: Any) -> str | None:
    """A key function that trusts what the client sends: a JSON string in X-Json."""
    raw = request.headers.get("X-Json")
    return None if raw is None else json.loads(raw)


@pytest.fixture
def json_keys(settings: Any) -> None:
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "KEY_FUNCTIONS": {"json": "tests.test_rejection_log.json_client"},
    }


@pytest.fixture
def another_process() -> Any:
    """A second buffer, as another web process has: it hands its counts on to Redis alone."""
    made: list[RejectionLog] = []

    def make() -> RejectionLog:
        made.append(RejectionLog())
        return made[-1]

    yield make
    for log in made:
        log.discard()


def totals() -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for rule_name, action, count in Rejection.objects.values_list("rule", "action", "count"):
        out[(rule_name, action)] = out.get((rule_name, action), 0) + count
    return out


def minute_ago(minutes: float, now: float) -> float:
    """``minutes`` before ``now``, one reading of the clock for the whole test: read anew each
    time, a minute boundary crossed on the way would put two "different" minutes in one."""
    return now - minutes * 60


# -- any identity is stored or safely replaced ----------------------------------------------


@DB
def test_a_lone_surrogate_identity_is_stored_replaced_and_holds_back_no_one(json_keys):
    rule("by-json", "by-json", 1, key_kind="custom", key_arg="json")
    post = partial(RequestFactory().post, "/", content_type="application/json")
    senders = [json.dumps(f"client-{n}") for n in range(30)] + [json.dumps("\udcff")]
    for raw in senders:
        assert [check(post(HTTP_X_JSON=raw), "by-json").allowed for _ in range(2)] == [
            True,
            False,
        ]

    assert flush() == 31  # the poisoned one and the 30 others, in one flush
    assert flush() == 0  # nothing left to retry
    stored = Rejection.objects.get(key=digest("custom:\udcff"))
    assert stored.display == "custom:\ufffd"
    assert stored.count == 1
    assert Rejection.objects.filter(rule="by-json").count() == 31


def test_the_display_of_any_identity_is_short_visible_and_encodable():
    assert display_of("custom:\udcff") == "custom:\ufffd"
    assert display_of("custom:\ud83d\ude00") == "custom:\U0001f600"  # a pair: its character
    assert display_of("header:a\x00b\x07c\u202ed") == "header:abcd"
    huge = "h" * 1_000_000
    assert display_of("header:" + huge) == "header:" + "h" * 64 + "\u2026"
    assert display_of("ip:" + "\x01" * 1_000_000) == "ip:"  # only its head is looked at
    hidden_then_text = "\u200b" * 500 + "visible"
    assert display_of("param:" + hidden_then_text) == "param:\u2026"


@DB
def test_control_characters_a_1_mb_value_and_an_odd_rule_name_are_stored(json_keys):
    rule("by-json", "by-json", 1, key_kind="custom", key_arg="json")
    post = partial(RequestFactory().post, "/", content_type="application/json")
    values = ["nul\x00and\x1b[31mescape", "v" * 1_000_000]
    for value in values:
        request = partial(post, HTTP_X_JSON=json.dumps(value))
        assert not [check(request(), "by-json").allowed for _ in range(2)][-1]
    rejection_log().add("scope\x00" + "s" * 300, "ip:192.0.2.1", "reject")  # a code default's

    assert flush() == 3
    displays = set(Rejection.objects.values_list("display", flat=True))
    assert displays == {"custom:nuland[31mescape", "custom:" + "v" * 64 + "\u2026", "ip:192.0.2.1"}
    assert Rejection.objects.filter(rule="scope" + "s" * 95).exists()  # 100 characters, no NUL
    assert Rejection.objects.get(key=digest("custom:" + "v" * 1_000_000)).count == 1


# -- one bad row never holds back the others ------------------------------------------------


@DB
def test_a_row_the_database_refuses_is_set_apart_and_the_others_are_written():
    minute = int(time.time()) // 60 * 60
    counts = {
        ("api", digest(f"ip:192.0.2.{n}"), "reject", minute): [n, f"ip:192.0.2.{n}"]
        for n in range(1, 41)
    }
    # Text no driver encodes, handed over as it is: stored escaped.
    counts[("api", digest("custom:odd"), "reject", minute)] = [5, "custom:\udcff"]
    # A count below zero breaks the column's CHECK: refused however it is written.
    counts[("api", digest("ip:192.0.2.99"), "reject", minute)] = [-1, "ip:192.0.2.99"]

    done = write_each(counts)

    assert done.rows == 41
    assert not done.kept
    assert [(entry[1], n) for entry, n, _ in done.dropped] == [(digest("ip:192.0.2.99"), -1)]
    assert Rejection.objects.get(key=digest("custom:odd")).display == "custom:\\udcff"
    assert totals() == {("api", "reject"): sum(range(1, 41)) + 5}


@pytest.mark.django_db(transaction=True)
def test_a_refused_row_is_logged_given_up_and_later_flushes_are_clean(caplog):
    log = RejectionLog()
    try:
        for n in range(20):
            log.add("api", f"ip:192.0.2.{n}", "reject")
        entry = next(iter(log._counts))
        log._counts[entry][0] = -3  # what no database column takes
        with caplog.at_level(logging.ERROR, logger="django_throttle"):
            assert log.flush() == 19
        assert "refused the -3 reject rejection(s)" in caplog.text
        assert len(log) == 0 and log.dropped == -3
        log.add("api", "ip:192.0.2.200", "reject")
        assert log.flush() == 1
    finally:
        log.discard()
    assert totals() == {("api", "reject"): 20}


# -- a bounded log ----------------------------------------------------------------------------


@DB
def test_a_minute_names_a_bounded_number_of_clients_across_processes(another_process):
    """Two processes flooded by 300 clients each under one rule, and a quiet rule: 200
    clients by name in the minute, at least 5 of the quiet rule's, every rejection counted."""
    now = time.time()
    first, second = another_process(), another_process()
    for n in range(300):
        first.add("flood", f"ip:10.0.{n // 256}.{n % 256}", "reject", when=now)
        second.add("flood", f"ip:10.1.{n // 256}.{n % 256}", "reject", when=now)
    first.push()
    second.push()  # the minute's names are taken: its clients count as (other clients)
    for n in range(3):
        second.add("login", f"ip:192.0.2.{n}", "reject", when=now)
    second.push()
    collect()

    named = Rejection.objects.exclude(key=OVERFLOW_KEY)
    assert named.filter(rule="flood").count() == NAMED_PER_PERIOD
    assert named.filter(rule="login").count() == 3  # its floor: crowded out by no one
    assert Rejection.objects.get(rule="flood", key=OVERFLOW_KEY).count == 600 - NAMED_PER_PERIOD
    assert totals() == {("flood", "reject"): 600, ("login", "reject"): 3}


@DB
def test_the_memory_backend_bounds_a_minute_in_its_process(settings):
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "BACKEND": "memory"}
    now = time.time()
    for n in range(NAMED_PER_PERIOD + 50):
        rejection_log().add("flood", f"ip:10.0.{n // 256}.{n % 256}", "reject", when=now)
    for n in range(NAMED_PER_RULE + 2):
        rejection_log().add("login", f"ip:192.0.2.{n}", "reject", when=now)
    flush()
    assert Rejection.objects.filter(rule="flood").exclude(key=OVERFLOW_KEY).count() == 200
    assert Rejection.objects.filter(rule="login").exclude(key=OVERFLOW_KEY).count() == 5
    other = Rejection.objects.get(rule="login", key=OVERFLOW_KEY)
    assert (other.display, other.count) == (OVERFLOW_DISPLAY, 2)
    assert totals() == {("flood", "reject"): 250, ("login", "reject"): 7}


def add_minute(rule_name: str, minute: float, clients: int, heavy: int = 0, crowd: int = 0) -> None:
    """Rows of one minute, as processes of a flood wrote them: ``heavy`` clients with 50
    rejections (the same ones every minute), then ``clients`` with one each, numbered from
    ``crowd``."""
    at = datetime.fromtimestamp(int(minute) // 60 * 60, tz=dt_timezone.utc)
    numbers = [*range(heavy), *range(1000 + crowd, 1000 + crowd + clients)]
    Rejection.objects.bulk_create(
        Rejection(
            rule=rule_name,
            key=digest(f"ip:10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"),
            display=f"ip:10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}",
            action="reject",
            minute=at,
            count=50 if n < heavy else 1,
        )
        for n in numbers
    )


@DB
def test_compaction_merges_old_minutes_keeping_the_totals_and_the_largest_clients():
    now = time.time()
    for ago in range(3 * 60, 3 * 60 + 30):  # half an hour, three hours ago
        add_minute("flood", minute_ago(ago, now), 147, heavy=3, crowd=ago * 1000)
        add_minute("login", minute_ago(ago, now), 2)
    for ago in range(3 * 24 * 60, 3 * 24 * 60 + 10):  # three days ago
        add_minute("flood", minute_ago(ago, now), 27, heavy=3, crowd=ago * 1000)
    add_minute("flood", minute_ago(5, now), 10)  # in the hour: left as it is
    before, rows_before = totals(), Rejection.objects.count()
    week_before = dashboard_data(None, "week")

    removed = compact(now=now)

    assert removed == rows_before - Rejection.objects.count() > 0
    assert totals() == before
    periods = set(Rejection.objects.values_list("minute", "minutes"))
    assert {length for _, length in periods} == {120, 15, 1}
    for at, length in periods:
        assert int(at.timestamp()) % (length * 60) == 0  # a period starts on its step
        named = Rejection.objects.filter(minute=at, minutes=length).exclude(key=OVERFLOW_KEY)
        assert named.count() <= NAMED_PER_PERIOD
    # The heavy hitters keep their names in every period; the quiet rule keeps its clients.
    for at, length in periods:
        if length > 1:
            assert Rejection.objects.filter(minute=at, key=digest("ip:10.0.0.0")).exists()
    assert not Rejection.objects.filter(rule="login", key=OVERFLOW_KEY).exists()
    assert Rejection.objects.filter(rule="flood", key=OVERFLOW_KEY, minutes=15).exists()
    assert compact(now=now) == 0  # nothing left to merge
    week_after = dashboard_data(None, "week")
    assert week_after["totals"] == week_before["totals"]
    assert week_after["series"] == week_before["series"]
    named = [row["display"] for row in week_after["top_keys"] if row["key"] != OVERFLOW_KEY]
    assert named[:3] == ["ip:10.0.0.0", "ip:10.0.0.1", "ip:10.0.0.2"]


@DB
def test_minutes_written_past_the_bounds_are_trimmed_to_them():
    """Processes writing their own counts while Redis failed, or rows from before the
    bounds: a past minute is cut down to the bounds, its totals kept."""
    now = time.time()
    add_minute("api", minute_ago(10, now), 500, heavy=3)
    add_minute("login", minute_ago(10, now), 3, crowd=10_000)
    add_minute("api", minute_ago(0.5, now), 300)  # the current minute: not complete yet
    before = totals()

    compact(now=now)

    assert totals() == before
    past = Rejection.objects.filter(minute__lt=timezone.now() - timedelta(minutes=5))
    assert past.exclude(key=OVERFLOW_KEY).count() == NAMED_PER_PERIOD
    assert past.filter(minutes=1).count() == past.count()  # still minutes: in the hour view
    assert past.filter(rule="login").exclude(key=OVERFLOW_KEY).count() == 3
    assert {"ip:10.0.0.0", "ip:10.0.0.1", "ip:10.0.0.2"} <= set(
        past.values_list("display", flat=True)
    )
    assert past.get(rule="api", key=OVERFLOW_KEY).count == 500 - (NAMED_PER_PERIOD - 3 - 3)
    current = Rejection.objects.filter(minute__gte=timezone.now() - timedelta(minutes=2))
    assert current.count() == 300


@DB
def test_the_day_view_puts_quarter_hours_in_their_steps():
    now = time.time()
    add_minute("api", minute_ago(3 * 60, now), 4)
    add_minute("api", minute_ago(3 * 60 + 1, now), 4)
    add_minute("api", minute_ago(10, now), 1)
    compact(now=now)
    day = dashboard_data(None, "day")
    (series,) = day["series"]
    assert sum(series["counts"]) == 9
    assert sorted(c for c in series["counts"] if c) in ([1, 8], [1, 4, 4])
    hour = dashboard_data(None, "hour")
    assert [t["total"] for t in hour["totals"]] == [1]  # the merged rows are past the hour
    recent = day["recent"]
    assert {row["minutes"] for row in recent} == {1, 15}


@pytest.mark.django_db(transaction=True)
def test_two_processes_compacting_at_once_never_count_twice():
    now = time.time()
    for ago in range(2 * 24 * 60, 2 * 24 * 60 + 120):
        add_minute("flood", minute_ago(ago, now), 20, heavy=2)
    before = totals()
    errors: list[BaseException] = []

    def compactor() -> None:
        try:
            compact()
        except OperationalError as exc:  # SQLite: the other one holds the write lock
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=compactor) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    compact()  # whatever a loser left
    assert totals() == before
    assert not Rejection.objects.filter(minutes=1).exists()
    assert len(errors) <= 1


# -- counts from every process ----------------------------------------------------------------


@DB
def test_throttle_flush_writes_the_counts_every_process_handed_to_redis(another_process):
    web1, web2 = another_process(), another_process()
    now = time.time()
    for _ in range(3):
        web1.add("api", "ip:192.0.2.1", "reject", when=now)
    web2.add("api", "ip:192.0.2.1", "reject", when=now)
    web2.add("login", "ip:192.0.2.2", "shadow", when=now)
    web1.push()
    web2.push()
    assert not Rejection.objects.exists()  # nothing written by the web processes
    out = io.StringIO()
    call_command("throttle_flush", stdout=out)
    assert "Flushed 2 rejection row(s)." in out.getvalue()
    assert totals() == {("api", "reject"): 4, ("login", "shadow"): 1}
    call_command("throttle_flush", stdout=out)
    assert totals() == {("api", "reject"): 4, ("login", "shadow"): 1}  # folded once


@DB
def test_a_flood_costs_one_redis_call_per_push_not_per_rejection(redis_client):
    for n in range(4):
        rejection_log().add("flood", f"ip:192.0.2.{n}", "reject")  # the flusher thread starts
    redis_client.config_resetstat()
    for n in range(10_000):
        rejection_log().add("flood", f"ip:192.0.2.{n % 4}", "reject")
    rejection_log().push()
    rejection_log().push()  # nothing new: no call
    stats = redis_client.info("commandstats")
    calls = {name: v["calls"] for name, v in stats.items()}
    assert calls["cmdstat_evalsha"] in (1, 2)  # and maybe the flusher thread's push
    # Commands inside the script count too: a few per client, none per rejection.
    assert sum(calls.values()) < 60, calls
    waiting = redis_client.hgetall(counts_key())
    assert sum(int(v) for v in waiting.values()) == 10_004


@DB
def test_every_key_in_redis_is_written_with_a_ttl(redis_client):
    minute = int(time.time()) // 60 * 60
    rejection_log().add("api", "ip:192.0.2.1", "reject", when=minute)
    rejection_log().push()
    keys = {key.decode() for key in redis_client.keys("*")}
    assert keys == {counts_key(), named_key(minute)}
    assert all(redis_client.pttl(key) > 0 for key in keys)


@pytest.mark.django_db(transaction=True)
def test_concurrent_collections_fold_every_count_once(another_process):
    webs = [another_process() for _ in range(3)]
    folders = [another_process() for _ in range(2)]  # dashboards of two other processes
    stop = threading.Event()
    counted = [0] * len(webs)

    def serve(index: int) -> None:
        n = 0
        while not stop.is_set():
            webs[index].add("api", f"ip:192.0.2.{n % 7}", "reject")
            counted[index] += 1
            n += 1
            if n % 25 == 0:
                webs[index].push()
        webs[index].push()

    def fold(folder: RejectionLog) -> None:
        try:
            while not stop.is_set():
                folder.collect()
        finally:
            connection.close()

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(len(webs))]
    threads += [threading.Thread(target=fold, args=(folder,)) for folder in folders]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    stop.set()
    for thread in threads:
        thread.join(30)
    for folder in folders:  # what a folder kept after a write that found the database busy
        folder.collect()
    collect()
    assert totals() == {("api", "reject"): sum(counted)}


@pytest.mark.django_db(transaction=True)
def test_folded_counts_survive_a_database_failure(another_process, caplog):
    web = another_process()
    web.add("api", "ip:192.0.2.1", "reject")
    web.add("api", "ip:192.0.2.1", "reject")
    web.push()
    table = connection.ops.quote_name(Rejection._meta.db_table)
    moved = connection.ops.quote_name(Rejection._meta.db_table + "_away")
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO {moved}")
    try:
        assert collect() == 0
        assert rejection_log().pending == 2  # the folder holds them, to hand on again
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {moved} RENAME TO {table}")
    assert collect() == 1
    assert totals() == {("api", "reject"): 2}


@DB
def test_with_redis_down_a_process_writes_its_own_counts_and_loses_none(redis_server, caplog):
    rule("api", "api", 1)
    request = partial(RequestFactory().get, "/", REMOTE_ADDR="192.0.2.1")
    assert [check(request(), "api").allowed for _ in range(3)] == [True, False, False]
    rejection_log().push()  # two rejections waiting in Redis
    rejection_log().add("api", "ip:192.0.2.2", "reject")
    redis_server.kill()
    try:
        with caplog.at_level(logging.ERROR, logger="django_throttle"):
            assert flush() == 1  # its own, straight to the database; no request broken
        assert "could not hand 1 rejection counts and 0 sizing counts to Redis" in caplog.text
        assert totals() == {("api", "reject"): 1}
    finally:
        redis_server.start()
    # A new, empty server: what waited in the old one is gone with it, as a crash takes it.
    rejection_log().add("api", "ip:192.0.2.3", "reject")
    assert flush() == 1
    assert totals() == {("api", "reject"): 2}


@DB
@pytest.mark.usefixtures("throttle_middleware")
def test_with_redis_down_requests_pass_and_their_rejections_reach_the_database(
    client, redis_server
):
    rule("api", "/api/", 1)  # fails open: enforced per process while Redis is down
    assert client.get("/api/items/", REMOTE_ADDR="192.0.2.1").status_code == 200
    redis_server.kill()
    try:
        codes = [client.get("/api/items/", REMOTE_ADDR="192.0.2.1").status_code for _ in range(3)]
        assert codes == [200, 429, 429]  # the local fallback, counting from zero
        assert flush() == 1
        assert totals() == {("api", "reject"): 2}
    finally:
        redis_server.start()


@DB
def test_the_memory_backend_writes_its_own_counts_and_touches_no_redis(settings, redis_client):
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "BACKEND": "memory"}
    rejection_log().add("api", "ip:192.0.2.1", "reject")
    rejection_log().push()
    assert len(rejection_log()) == 1  # pushing is for Redis only
    assert flush() == 1
    assert totals() == {("api", "reject"): 1}
    assert redis_client.keys("*") == []


# What the rejection log sends besides the commands docs/deploying.md grants for decisions
# (inside push.lua and take.lua, and the fold's own HSCAN).
RECORDING_COMMANDS = ["+hexists", "+hget", "+hset", "+hincrby", "+exists", "+rename", "+hscan"]


@DB
def test_the_acl_user_with_the_recording_commands_is_enough(settings, redis_server):
    from contextlib import closing

    import redis

    from django_throttle.runtime import replace_runtime
    from tests.test_acl import PASSWORD, acl_lines, denied, set_user

    if not redis_server.managed:
        pytest.skip("changes the users of a redis-server the harness runs; unset REDIS_URL")
    single, _ = acl_lines()
    set_user(redis_server.port, [*single, *RECORDING_COMMANDS])
    try:
        url = f"redis://throttle:{PASSWORD}@127.0.0.1:{redis_server.port}/0"
        settings.CACHES = {
            **settings.CACHES,
            "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url},
        }
        replace_runtime(handover=False)
        web = RejectionLog()
        try:
            web.add("api", "ip:192.0.2.1", "reject")
            web.push()
            assert len(web) == 0  # handed to Redis
            assert collect() == 1
        finally:
            web.discard()
            replace_runtime(handover=False)
        assert totals() == {("api", "reject"): 1}
        assert denied(redis_server.port) == []
    finally:
        with closing(redis.Redis(port=redis_server.port)) as admin:
            admin.execute_command("ACL", "DELUSER", "throttle")
            admin.execute_command("ACL", "LOG", "RESET")


# Another OS process serves requests and hands its counts to the shared Redis every second,
# and never writes to a database of its own (FLUSH_INTERVAL is an hour); it stays up, and
# serves 12 more requests for each line it reads.
WEB = """
import sys, django
from django.conf import settings
settings.DATABASES["default"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}
settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "FLUSH_INTERVAL": 3600, "TIMEOUT": 5.0}
django.setup()
from django.core.management import call_command
from django.test import RequestFactory
from django_throttle import check
from django_throttle.models import Rule
call_command("migrate", verbosity=0)
Rule.objects.create(name="api", scope="api", limit=1, unit="hour", algorithm="fixed_window")
def serve():
    ips = [f"192.0.2.{n % 3}" for n in range(12)]
    print(sum(not check(RequestFactory().get("/", REMOTE_ADDR=ip), "api").allowed for ip in ips))
    sys.stdout.flush()
serve()
for line in sys.stdin:
    serve()
"""


def wait_for_totals(read: Any, total: int) -> Any:
    deadline = time.monotonic() + 20
    while True:
        data = read()
        if sum(t["total"] for t in data["totals"]) >= total or time.monotonic() > deadline:
            return data
        time.sleep(0.1)


@pytest.mark.slow
@DB
def test_the_dashboard_and_throttle_flush_see_another_process_s_counts(admin_client, tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    web = subprocess.Popen(
        [sys.executable, "-c", WEB, str(tmp_path / "web.sqlite3")],
        cwd=ROOT,
        env=env,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert web.stdout is not None and web.stdin is not None
        assert int(web.stdout.readline()) == 9
        data = wait_for_totals(lambda: admin_client.get(DATA).json(), 9)
        assert web.poll() is None  # still serving: it flushed nothing itself
        assert data["totals"] == [
            {"rule": "api", "reject": 9, "unavailable": 0, "shadow": 0, "total": 9}
        ]
        assert sorted(row["total"] for row in data["top_keys"]) == [3, 3, 3]

        web.stdin.write("more\n")
        web.stdin.flush()
        assert int(web.stdout.readline()) == 12  # every client is past its limit now

        def throttle_flush() -> dict[str, Any]:
            call_command("throttle_flush", stdout=io.StringIO())
            return dashboard_data(None, "hour")

        assert wait_for_totals(throttle_flush, 21)["totals"][0]["total"] == 21
        assert web.poll() is None
    finally:
        _, err = web.communicate("", timeout=60)
    assert web.returncode == 0, err


@pytest.mark.topology
@DB
def test_a_cluster_store_shares_counts_through_one_slot(settings):
    from redis.cluster import RedisCluster

    from django_throttle.runtime import replace_runtime
    from tests.redis_topology import ClusterHarness

    with ClusterHarness() as cluster:
        settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "CLUSTER_URL": cluster.url}
        replace_runtime(handover=False)
        web = RejectionLog()
        minute = int(time.time()) // 60 * 60
        try:
            for n in range(5):
                web.add("api", f"ip:192.0.2.{n}", "reject", when=minute)
            web.push()
            assert flush() == 5
        finally:
            web.discard()
            replace_runtime(handover=False)
        assert totals() == {("api", "reject"): 5}
        with RedisCluster.from_url(cluster.url) as client:
            assert client.exists(counts_key()) == 0  # folded
            assert client.pttl(named_key(minute)) > 0
