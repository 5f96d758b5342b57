"""The rejection log's rows: bulk writes that add, retention, and compaction into longer periods."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, cast

from django.conf import settings
from django.db import InterfaceError, OperationalError, connections, router, transaction
from django.db.models import Count, Field, Sum
from django.utils import timezone as django_timezone

from ..choices import RejectionAction
from ..conf import conf
from ..models import Rejection, SizingCount
from .display import (
    DISPLAY_CHARS,
    OVERFLOW_DISPLAY,
    OVERFLOW_KEY,
    RULE_CHARS,
    escaped,
    storable_rule,
)

Entry = tuple[str, str, str, int]  # rule name, key digest, action, minute (Unix seconds)
Counts = dict[Entry, list[Any]]  # entry -> [count, display]
Size = tuple[str, int, int]  # sizing: rule, hour (Unix seconds), boundary (sizing.py)
Sizes = dict[Size, int]
OVER = 0  # the sizing boundary that holds the requests past the rule's own limit
HOUR = 3600

# Clients kept by name per period (a minute, a quarter hour, two hours), all rules together;
# each rule and action keeps at least NAMED_PER_RULE whatever the others took. The other
# clients are summed per rule and action under OVERFLOW_KEY. So the rows of a period are
# bounded whatever the flood, and with them the dashboard's reading time and the table.
NAMED_PER_PERIOD = 200
NAMED_PER_RULE = 5
ACTIONS = RejectionAction.values
SPLIT_BUDGET = 40  # statements one write may spend finding the rows the database refuses


@dataclass(frozen=True)
class Level:
    """Rows older than ``after`` seconds are merged into periods of ``minutes``."""

    minutes: int
    after: int


# Past the dashboard's hour view, quarter hours (its day view's step); past its day view, two
# hours (its week view's step). A period is merged only once no view of that finer step can
# show part of it (the margin covers a process whose clock is a little ahead).
LEVELS = (Level(120, 86400 + 900), Level(15, 3600 + 300))
# A minute this old has every process's counts (each pushes every second): it may be trimmed.
MINUTE = Level(1, 120)
PERIODS_PER_PASS = 1  # periods merged in one transaction: a short lock, even on old, unbounded rows


def as_datetime(epoch: int) -> datetime:
    """A Unix time as the database's minute column holds it (naive without USE_TZ)."""
    value = datetime.fromtimestamp(epoch, tz=timezone.utc)
    return value if settings.USE_TZ else django_timezone.make_naive(value)


def epoch_of(value: datetime) -> int:
    if django_timezone.is_naive(value):
        value = django_timezone.make_aware(value)
    return int(value.timestamp())


# -- adding counts ------------------------------------------------------------------------

_FIELDS = ("rule", "key", "display", "action", "minute", "minutes", "count")
_UNIQUE = ("rule", "key", "action", "minute")


def _row(entry: Entry, slot: list[Any], minutes: int = 1) -> tuple[Any, ...]:
    rule, key, action, minute = entry
    display = slot[1][:DISPLAY_CHARS]
    return (storable_rule(rule), key, display, action, as_datetime(minute), minutes, slot[0])


def write(counts: Counts, upsert: bool | None = None) -> None:
    """Add these counts to the rejection log, in one transaction."""
    _add_rows([_row(entry, slot) for entry, slot in counts.items()], upsert)


def _add_rows(rows: list[tuple[Any, ...]], upsert: bool | None = None) -> None:
    if not rows:
        return
    using = router.db_for_write(Rejection)
    connection = connections[using]
    if upsert is None:
        upsert = connection.vendor in ("postgresql", "sqlite")
    with transaction.atomic(using=using):
        if upsert:
            _upsert(connection, rows)
        else:
            _read_modify_write(using, rows)


def _column(name: str) -> Field[Any, Any]:
    # get_field() may return a reverse relation; every name asked here is a column of Rejection.
    return cast("Field[Any, Any]", Rejection._meta.get_field(name))


def _upsert(connection: Any, rows: list[tuple[Any, ...]]) -> None:
    """INSERT ... ON CONFLICT DO UPDATE SET count = count + excluded.count, in batches. A row
    meeting a longer period's row keeps the longer period: that period holds it now."""
    quote = connection.ops.quote_name
    table = quote(Rejection._meta.db_table)
    target = ", ".join(quote(_column(name).column) for name in _UNIQUE)
    count, minutes = quote(_column("count").column), quote(_column("minutes").column)
    _insert_batches(
        connection,
        [_column(name) for name in _FIELDS],
        rows,
        f"ON CONFLICT ({target}) DO UPDATE SET "
        f"{count} = {table}.{count} + EXCLUDED.{count}, "
        f"{minutes} = CASE WHEN EXCLUDED.{minutes} > {table}.{minutes} "
        f"THEN EXCLUDED.{minutes} ELSE {table}.{minutes} END",
    )


def _insert_batches(
    connection: Any, fields: list[Any], rows: list[tuple[Any, ...]], conflict: str
) -> None:
    """INSERT ``rows`` of ``fields`` into their model's table with the ``conflict`` clause, in
    batches the database takes."""
    quote = connection.ops.quote_name
    table = quote(fields[0].model._meta.db_table)
    columns = ", ".join(quote(f.column) for f in fields)
    placeholders = "(" + ", ".join(["%s"] * len(fields)) + ")"
    size = max(1, connection.ops.bulk_batch_size(fields, rows) or len(rows))
    with connection.cursor() as cursor:
        for start in range(0, len(rows), size):
            batch = rows[start : start + size]
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES {', '.join([placeholders] * len(batch))} "
                + conflict,
                [
                    field.get_db_prep_save(value, connection)
                    for row in batch
                    for field, value in zip(fields, row, strict=True)
                ],
            )


def _read_modify_write(using: str, rows: list[tuple[Any, ...]]) -> None:
    """For databases without ON CONFLICT: lock the existing rows, add, insert the others. A
    concurrent insert of the same row raises IntegrityError; the flush keeps the counts and
    the next one adds them."""
    wanted = {(r[0], r[1], r[3], r[4]): r for r in rows}
    manager = Rejection.objects.using(using)
    existing = manager.select_for_update().filter(
        minute__in={r[4] for r in rows}, key__in={r[1] for r in rows}
    )
    changed = []
    for row in existing:
        new = wanted.pop((row.rule, row.key, row.action, row.minute), None)
        if new is not None:
            row.count += new[6]
            row.minutes = max(row.minutes, new[5])
            changed.append(row)
    if changed:
        manager.bulk_update(changed, ["count", "minutes"])
    if wanted:
        manager.bulk_create(
            [Rejection(**dict(zip(_FIELDS, r, strict=True))) for r in wanted.values()]
        )


# -- a row the database refuses -------------------------------------------------------------


@dataclass
class Written:
    """What ``write_each`` did: rows written, counts kept for later, counts given up."""

    rows: int = 0
    kept: Counts = field(default_factory=dict)
    dropped: list[tuple[Entry, int, BaseException]] = field(default_factory=list)


def is_outage(exc: BaseException) -> bool:
    """Whether the database itself failed (down, locked, table missing), not one row."""
    return isinstance(exc, (OperationalError, InterfaceError))


def write_each(counts: Counts, budget: int = SPLIT_BUDGET) -> Written:
    """Write the counts; if the database refuses the batch because of some rows, write the
    others and store those rows with their text escaped to ASCII, or give them up.

    The batch is halved, each half in its own transaction, until the refused rows are alone;
    at most ``budget`` statements are spent on that, and counts not reached are kept for the
    next flush. Raises when nothing at all could be written: then the database is at fault
    (an outage, a missing table), not a row, and the caller keeps every count.
    """
    try:
        write(counts)
        return Written(rows=len(counts))
    except Exception as exc:
        if is_outage(exc):
            raise
        first = exc
    done = Written()
    items = list(counts.items())
    refused: list[tuple[Entry, list[Any], BaseException]] = []
    parts: list[list[tuple[Entry, list[Any]]]] = []
    if len(items) == 1:
        refused.append((*items[0], first))
    else:
        parts = [items[len(items) // 2 :], items[: len(items) // 2]]
    while parts:
        part = parts.pop()
        if budget <= 0:
            done.kept.update(part)
            continue
        budget -= 1
        try:
            write(dict(part))
            done.rows += len(part)
        except Exception as exc:
            if is_outage(exc):
                for rest in (part, *parts):
                    done.kept.update(rest)
                parts = []
            elif len(part) == 1:
                refused.append((*part[0], exc))
            else:
                parts += [part[len(part) // 2 :], part[: len(part) // 2]]
    for entry, slot, error in refused:
        rule, key, action, minute = entry
        safe = (escaped(rule, RULE_CHARS), key, action, minute)
        try:
            write({safe: [slot[0], escaped(slot[1], DISPLAY_CHARS)]})
            done.rows += 1
        except Exception as again:
            if is_outage(again):
                done.kept[entry] = slot
            else:
                done.dropped.append((entry, slot[0], error))
    if not done.rows:
        raise first
    return done


# -- sizing counts -----------------------------------------------------------------------------


def write_sizes(sizes: Sizes) -> None:
    """Add these counts to SizingCount, in one transaction."""
    if not sizes:
        return
    using = router.db_for_write(SizingCount)
    connection = connections[using]
    rows = [
        (storable_rule(rule), as_datetime(hour), bound, n)
        for (rule, hour, bound), n in sizes.items()
    ]
    with transaction.atomic(using=using):
        if connection.vendor in ("postgresql", "sqlite"):
            _upsert_sizes(connection, rows)
        else:
            _read_modify_write_sizes(using, rows)


def _upsert_sizes(connection: Any, rows: list[tuple[Any, ...]]) -> None:
    quote = connection.ops.quote_name
    meta = SizingCount._meta
    fields = [meta.get_field(name) for name in ("rule", "hour", "reached", "count")]
    table = quote(meta.db_table)
    columns = [quote(f.column) for f in fields]  # type: ignore[union-attr]
    count = columns[3]
    _insert_batches(
        connection,
        fields,
        rows,
        f"ON CONFLICT ({', '.join(columns[:3])}) "
        f"DO UPDATE SET {count} = {table}.{count} + EXCLUDED.{count}",
    )


def _read_modify_write_sizes(using: str, rows: list[tuple[Any, ...]]) -> None:
    wanted = {(r[0], r[1], r[2]): r for r in rows}
    manager = SizingCount.objects.using(using)
    changed = []
    for row in manager.select_for_update().filter(hour__in={r[1] for r in rows}):
        new = wanted.pop((row.rule, row.hour, row.reached), None)
        if new is not None:
            row.count += new[3]
            changed.append(row)
    if changed:
        manager.bulk_update(changed, ["count"])
    if wanted:
        manager.bulk_create(
            [SizingCount(rule=r[0], hour=r[1], reached=r[2], count=r[3]) for r in wanted.values()]
        )


def prune_sizes(before: datetime) -> int:
    """Delete the sizing counts of hours before ``before``; return how many rows."""
    deleted, _ = SizingCount.objects.filter(hour__lt=before).delete()
    return deleted


def read_sizes(rule: str, start: datetime, end: datetime, period: int) -> dict[int, int]:
    """Boundary -> sum over the windows of ``period`` seconds that overlap [start, end): those
    that started in it or in the ``period`` before it (rows are hours of windows' starts)."""
    first = as_datetime((epoch_of(start) - period) // HOUR * HOUR)
    rows = (
        SizingCount.objects.filter(rule=storable_rule(rule), hour__gte=first, hour__lt=end)
        .values("reached")
        .annotate(n=Sum("count"))
        .order_by()
    )
    return {row["reached"]: row["n"] for row in rows}


# -- retention and compaction -----------------------------------------------------------------


def prune(days: int | None = None) -> int:
    """Delete the rejection counts, and the sizing's, older than ``days`` (default
    RETENTION_DAYS); return how many rejection rows."""
    days = conf.RETENTION_DAYS if days is None else days
    cutoff = django_timezone.now() - timedelta(days=days)
    deleted, _ = Rejection.objects.filter(minute__lt=cutoff).delete()
    prune_sizes(cutoff)
    return deleted


def compact(now: float | None = None, seconds: float | None = None) -> int:
    """Merge old rows into longer periods (LEVELS), and trim past minutes that hold more
    clients by name than the bounds allow (written by processes on their own while Redis
    failed, or before the bounds existed), keeping clients by name as ``merge_periods`` does;
    return the rows removed. ``seconds``: stop after about that long (the rest next time)."""
    now = time.time() if now is None else now
    deadline = None if seconds is None else time.monotonic() + seconds
    removed = 0
    for level in LEVELS:  # the longest first: rows older than a day skip the quarter hours
        step = level.minutes * 60
        cutoff = int(now - level.after) // step * step
        shorter = [1, *(other.minutes for other in LEVELS if other.minutes < level.minutes)]
        while deadline is None or time.monotonic() < deadline:
            # One lookup per length: (minutes, minute) is then an index range, never a scan.
            firsts = [
                Rejection.objects.filter(minutes=length, minute__lt=as_datetime(cutoff))
                .order_by("minute")
                .values_list("minute", flat=True)
                .first()
                for length in shorter
            ]
            found = [epoch_of(first) for first in firsts if first is not None]
            if not found:
                break
            start = min(found) // step * step
            removed += _merge(level, start, min(start + step * PERIODS_PER_PASS, cutoff))
    quarters = LEVELS[-1]
    since = int(now - quarters.after) // (quarters.minutes * 60) * quarters.minutes * 60
    for minute in _crowded_minutes(since, int(now - MINUTE.after) // 60 * 60):
        if deadline is not None and time.monotonic() >= deadline:
            break
        removed += _merge(MINUTE, minute, minute + 60)
    return removed


def _crowded_minutes(since: int, until: int) -> list[int]:
    """Minutes of [since, until) with more rows than push.lua lets a minute have."""
    minutes = (
        Rejection.objects.filter(
            minutes=1, minute__gte=as_datetime(since), minute__lt=as_datetime(until)
        )
        .values("minute")
        .annotate(rows=Count("id"), rules=Count("rule", distinct=True))
        .order_by("minute")
    )
    # At most the minute's budget, plus per rule and action its floor and its other clients.
    return [
        epoch_of(m["minute"])
        for m in minutes
        if m["rows"] > NAMED_PER_PERIOD + (NAMED_PER_RULE + 1) * len(ACTIONS) * m["rules"]
    ]


def _merge(level: Level, start: int, end: int) -> int:
    """Merge the rows of [start, end) into periods of ``level.minutes``, in one transaction.

    Rows are deleted by the ids read under lock, and the merged rows are added with ON
    CONFLICT: a minute row written meanwhile is not lost, and two processes merging at once
    never count a row twice (the second finds the rows gone).
    """
    using = router.db_for_write(Rejection)
    step = level.minutes * 60
    manager = Rejection.objects.using(using)
    with transaction.atomic(using=using):
        rows = list(
            manager.select_for_update()
            .filter(
                minute__gte=as_datetime(start),
                minute__lt=as_datetime(end),
                minutes__lte=level.minutes,
            )
            .values_list("id", "rule", "key", "display", "action", "minute", "count")
        )
        if not rows:
            return 0
        merged = merge_periods(
            ((rule, key, action, epoch_of(minute) // step * step), count, display)
            for _, rule, key, display, action, minute, count in rows
        )
        ids = [row[0] for row in rows]
        for chunk in range(0, len(ids), 500):
            manager.filter(id__in=ids[chunk : chunk + 500]).delete()
        _add_rows([_row(entry, slot, level.minutes) for entry, slot in merged.items()])
    return len(rows) - len(merged)


def merge_periods(counts: Iterable[tuple[Entry, int, str]]) -> Counts:
    """Counts summed per entry; per period, clients by name within the bounds above: the
    largest NAMED_PER_RULE of each rule and action, then the largest of all up to
    NAMED_PER_PERIOD (ties by rule, action, key); the others summed under OVERFLOW_KEY."""
    summed: Counts = {}
    for entry, n, display in counts:
        slot = summed.get(entry)
        if slot is None:
            summed[entry] = [n, display]
        else:
            slot[0] += n
    periods: dict[int, list[Entry]] = {}
    for entry in summed:
        if entry[1] != OVERFLOW_KEY:
            periods.setdefault(entry[3], []).append(entry)
    for minute, entries in periods.items():
        if len(entries) <= NAMED_PER_PERIOD:
            continue
        entries.sort(key=lambda e: (-summed[e][0], e[0], e[2], e[1]))
        kept: set[Entry] = set()
        per_rule: dict[tuple[str, str], int] = {}
        for entry in entries:
            group = (entry[0], entry[2])
            if per_rule.get(group, 0) < NAMED_PER_RULE:
                per_rule[group] = per_rule.get(group, 0) + 1
                kept.add(entry)
        room = NAMED_PER_PERIOD - len(kept)
        for entry in entries:
            if room <= 0:
                break
            if entry not in kept:
                kept.add(entry)
                room -= 1
        for entry in entries:
            if entry not in kept:
                rule, _, action, _ = entry
                other = summed.setdefault(
                    (rule, OVERFLOW_KEY, action, minute), [0, OVERFLOW_DISPLAY]
                )
                other[0] += summed.pop(entry)[0]
    return summed
