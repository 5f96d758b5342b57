"""The dashboard with 1,000,000 rejection rows (docs/benchmarks.md, "The dashboard with 1,000,000
rejection rows")."""

from __future__ import annotations

import argparse
import itertools
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import harness

urlpatterns: list[Any] = []  # this module is the ROOT_URLCONF; filled in by configure()

POOL = 20_000  # distinct clients the flood comes from
PG_NAME = "throttle_bench"


def configure(redis_url: str, database: str | dict[str, Any]) -> None:
    """Django with its admin as the tests have it, the tables made, and a superuser who asks
    for the pages."""
    from tests.settings import TEMPLATES

    messages = "django.contrib.messages"
    harness.configure_django(
        redis_url,
        apps=["django.contrib.admin", "django.contrib.sessions", messages, "django_throttle"],
        database=database,
        migrate=True,
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            f"{messages}.middleware.MessageMiddleware",
        ],
        TEMPLATES=TEMPLATES,
        ROOT_URLCONF=__name__,
        STATIC_URL="static/",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
    )
    from django.contrib import admin
    from django.contrib.auth import get_user_model
    from django.urls import path

    urlpatterns[:] = [path("admin/", admin.site.urls)]
    get_user_model().objects.create_superuser("bench", "bench@example.com", "pw")


def postgres(create: bool = True) -> dict[str, Any]:
    """The bench's PostgreSQL database (PGUSER, PGHOST, PGPORT) dropped, and made again unless
    ``create`` is false; its settings, as Django names them."""
    import psycopg

    env = os.environ.get
    user, host, port = env("PGUSER", "postgres"), env("PGHOST", "127.0.0.1"), env("PGPORT", "5432")
    with psycopg.connect(dbname="postgres", user=user, host=host, port=port, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {PG_NAME}")
        if create:
            c.execute(f"CREATE DATABASE {PG_NAME}")
    engine = "django.db.backends.postgresql"
    return {"ENGINE": engine, "NAME": PG_NAME, "USER": user, "HOST": host, "PORT": port}


def periods(now: int) -> Iterator[tuple[int, int]]:
    """(start, minutes) of every period of one rule, newest first, as the log keeps them."""
    from django_throttle.rejection_log import LEVELS

    two_hours, quarters = LEVELS  # the longest level first
    start, step = now // 60 * 60, 60
    for level in (quarters, two_hours):  # minutes until the level's cut, then the level's
        span = level.minutes * 60
        cut = int(now - level.after) // span * span
        while start >= cut:
            yield start, step // 60
            start -= step
        start, step = cut - span, span
    while True:
        yield start, step // 60
        start -= step


def rows(rules: int, now: int) -> Iterator[tuple[Any, ...]]:
    """Rows (rule, key, display, action, minute, minutes, count), newest period first, every
    period as full as the log lets it be: in a minute, each rule names its floor
    (NAMED_PER_RULE) and the rules share the minute's budget (NAMED_PER_PERIOD) on top, as
    push.lua allows at most; in a longer period, the larger of the two, as compaction keeps;
    plus each rule's ``(other clients)``."""
    from django_throttle import rejection_log
    from django_throttle.store import digest

    per_period, per_rule = rejection_log.NAMED_PER_PERIOD, rejection_log.NAMED_PER_RULE
    overflow = (rejection_log.OVERFLOW_KEY, rejection_log.OVERFLOW_DISPLAY)
    clients = [f"ip:198.18.{i // 256}.{i % 256}" for i in range(POOL)]
    digests = [digest(c) for c in clients]
    shares = [per_period // rules + (r < per_period % rules) for r in range(rules)]
    for number, (start, minutes) in enumerate(periods(now)):
        when = datetime.fromtimestamp(start, tz=timezone.utc)
        for r in range(rules):
            named = shares[r] + per_rule if minutes == 1 else max(shares[r], per_rule)
            name = f"rule-{r:02d}"
            # The heavy hitters of the flood first, then a crowd that shifts every period.
            for i in range(named):
                c = i if i < 10 else 10 + (number * 37 + r * 7919 + i * 101) % (POOL - 10)
                count = max(1, 600 // (i + 1)) * minutes
                yield (name, digests[c], clients[c], "reject", when, minutes, count)
            yield (name, *overflow, "reject", when, minutes, 500 * minutes)


def unbounded_rows(total: int, rules: int, now: int) -> Iterator[tuple[Any, ...]]:
    """``total`` rows in the last hour as the log wrote them before it bounded a period (and as
    rows written around it are): every minute, every rule, as many distinct clients as it takes."""
    from django_throttle.store import digest

    per_minute = -(-total // (60 * rules))
    for ago in range(60):
        when = datetime.fromtimestamp((now // 60 - ago) * 60, tz=timezone.utc)
        for r in range(rules):
            for i in range(per_minute):
                n = i if i < 10 else ago * per_minute + i
                client = f"ip:10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"
                count = 50 if i < 10 else 1
                yield (f"rule-{r:02d}", digest(client), client, "reject", when, 1, count)


def fill(total: int, rules: int, now: int, unbounded: bool = False) -> float:
    from django.db import connection, transaction

    from django_throttle.models import Rejection

    table = Rejection._meta.db_table
    made = unbounded_rows(total, rules, now) if unbounded else rows(rules, now)
    source = itertools.islice(made, total)
    columns = "rule, key, display, action, minute, minutes, count"
    began = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            raw = cursor.cursor  # psycopg's own: COPY
            with raw.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in source:
                    copy.write_row(row)
        else:
            sql = f"INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s, %s, %s, %s)"
            adapt = connection.ops.adapt_datetimefield_value
            adapted = ((*row[:4], adapt(row[4]), *row[5:]) for row in source)
            while batch := list(itertools.islice(adapted, 10_000)):
                cursor.executemany(sql, batch)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return time.perf_counter() - began


def make_rules(count: int) -> float:
    """``count`` rules in the rule table, named as the rows name them (rule-00, rule-01...)."""
    from django.db import models

    from django_throttle.models import Rule

    began = time.perf_counter()
    rules = (Rule(name=f"rule-{r:02d}", scope=f"/r{r}/", limit=100) for r in range(count))
    # The plain QuerySet: the rules are valid, and validating 10,000 of them is not the bench.
    models.QuerySet(model=Rule).bulk_create(rules, batch_size=1000)
    return time.perf_counter() - began


def timed(url: str, repeat: int) -> tuple[str, str, str]:
    """The page's size in bytes, the median and the slowest of ``repeat`` timings in ms, after
    one that warms the caches; asked by the bench's superuser."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    client, samples, size = Client(), [], 0
    client.force_login(get_user_model().objects.get(username="bench"))
    for attempt in range(repeat + 1):
        began = time.perf_counter()
        response = client.get(url)
        elapsed = time.perf_counter() - began
        assert response.status_code == 200, (url, response.status_code)
        size = len(response.content)
        if attempt:
            samples.append(elapsed * 1000)
    return f"{size:,}", f"{statistics.median(samples):.0f}", f"{max(samples):.0f}"


def time_views(repeat: int) -> list[tuple[str, ...]]:
    from django_throttle.dashboard.queries import dashboard_data
    from django_throttle.models import Rejection

    out = []
    for period in ("hour", "day", "week"):
        for rule in ("", "rule-00"):
            url = f"/admin/django_throttle/dashboard/?period={period}"
            url += f"&rule={rule}" if rule else ""
            data = dashboard_data(rule or None, period)
            period_rows = Rejection.objects.filter(minute__gte=data["start"])
            if rule:
                period_rows = period_rows.filter(rule=rule)
            total = sum(t["total"] for t in data["totals"])
            figures = (f"{period_rows.count():,}", f"{total:,}", *timed(url, repeat))
            out.append((period, rule or "all rules", *figures))
    return out


def time_key_pages(repeat: int) -> list[tuple[str, ...]]:
    """The key page of the top client under one rule and under three, and a page of the
    pickers' search (what a browser asks while a rule is typed)."""
    from django_throttle.models import Rule

    pks = list(Rule.objects.order_by("name").values_list("pk", flat=True)[:3])
    key = "ip:198.18.0.0"  # the first client of the pool: a heavy hitter of every rule
    page = "/admin/django_throttle/dashboard/"
    urls = (
        ("key page, 1 rule", f"{page}key/?rule={pks[0]}&key={key}"),
        ("key page, 3 rules", f"{page}key/?{'&'.join(f'rule={pk}' for pk in pks)}&key={key}"),
        ("rule search, 'rule-1'", f"{page}rules/?term=rule-1"),
        ("rule search by name, page 5", f"{page}rules/?by=name&page=5"),
    )
    return [(name, *timed(url, repeat)) for name, url in urls]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rules", type=int, default=3, help="rules in the rule table")
    parser.add_argument("--flooded", type=int, help="of those, the rules the rows name (≤ 20)")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL instead of SQLite")
    parser.add_argument("--repeat", type=int, default=5, help="timed requests per view")
    parser.add_argument(
        "--unbounded", action="store_true", help="rows as written before the log was bounded"
    )
    args = parser.parse_args()
    if args.unbounded and "--rules" not in sys.argv:
        args.rules = 5
    if args.flooded is None:
        args.flooded = min(args.rules, 20)

    database: str | dict[str, Any] = os.path.join(tempfile.mkdtemp(prefix="bench-"), "db.sqlite3")
    if args.postgres:
        database = postgres()
    try:
        with harness.RedisServer() as server:
            configure(server.url, database)
            from django.db import connection

            from django_throttle.models import Rejection
            from django_throttle.rejection_log import compact

            now = int(time.time())
            made = make_rules(args.rules)
            seconds = fill(args.rows, args.flooded, now, args.unbounded)
            oldest = Rejection.objects.order_by("minute").values_list("minute", flat=True)[0]
            engine = f"SQLite {sqlite3.sqlite_version}"
            if args.postgres:
                engine = f"PostgreSQL {connection.pg_version // 10000}"
            harness.print_machine(*(["psycopg"] if args.postgres else []))
            shape = "written unbounded" if args.unbounded else "as the log keeps them"
            print(
                f"\n## Dashboard on {engine}: {Rejection.objects.count():,} rows {shape}, "
                f"{args.flooded} rules, since {oldest:%Y-%m-%d %H:%M} UTC "
                f"(filled in {seconds:.0f} s); {args.rules:,} rules in the rule table "
                f"(made in {made:.1f} s)\n"
            )
            header = ("period", "rule", "rows in period", "rejections", "page bytes")
            header += ("median ms", "max ms")
            harness.table(header, time_views(args.repeat))
            print()
            harness.table(("page", "bytes", "median ms", "max ms"), time_key_pages(args.repeat))
            began = time.perf_counter()
            merged = compact(now=now)
            print(
                f"\ncompact() over the whole table: {merged:,} rows merged "
                f"in {(time.perf_counter() - began) * 1000:.0f} ms"
            )
            if args.unbounded:
                print(f"\n### After that compact(): {Rejection.objects.count():,} rows\n")
                harness.table(header, time_views(args.repeat))
            connection.close()
    finally:
        if args.postgres:
            postgres(create=False)


if __name__ == "__main__":
    main()
