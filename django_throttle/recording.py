"""The rejection log: counted in each process's memory, persisted in bulk on a timer.

Recording must never make throttling slower:

- An admitted request pays nothing: ``note()`` looks at the decision and returns.
- A rejected request pays one dictionary increment under a lock, in this process's
  buffer, keyed by (rule, client, action, minute): no database query, no network call.
  Actions are ``reject`` (429), ``unavailable`` (503: the store is down and the rule
  fails closed) and ``shadow`` (a log-only rule would have rejected).
- The first rejection of a process (again after a fork) starts a daemon thread that
  persists the buffer every ``FLUSH_INTERVAL`` seconds, in one bulk statement that
  *adds* to the rows (``INSERT ... ON CONFLICT DO UPDATE SET count = count + n`` on
  PostgreSQL and SQLite; a locked read-modify-write in one transaction elsewhere). So
  the database sees one write per process per interval however large the flood, every
  process adds to the same rows, and the dashboard shows the totals of all processes
  within ``FLUSH_INTERVAL``. The thread ends when a flush finds nothing new; counts
  still buffered are flushed at exit. A failed flush keeps the counts for the next one.
- The buffer is bounded: past ``MAX_KEYS`` distinct entries in one interval, further
  clients are counted under one synthetic client per rule, action and minute,
  ``(other clients)``, so the totals stay right whatever the flood.
- Clients are stored as the store keys them (the digest of the identity) with a display
  form: the identity, with header, parameter and custom values cut to 64 characters and
  control characters removed. Nothing else of the request is kept.
- Rows older than ``RETENTION_DAYS`` are deleted by ``throttle_prune`` and by the flush
  (at most once an hour per process).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, cast

from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import Field
from django.utils import timezone as django_timezone

from .choices import KeyKind, RejectionAction
from .conf import conf
from .decision import Decision
from .keyspace import digest
from .models import Rejection

logger = logging.getLogger("django_throttle")

REJECT, UNAVAILABLE, SHADOW = (
    RejectionAction.REJECT.value,
    RejectionAction.UNAVAILABLE.value,
    RejectionAction.SHADOW.value,
)
ACTIONS = (REJECT, UNAVAILABLE, SHADOW)

MAX_KEYS = 10_000  # distinct (rule, client, action, minute) entries buffered per interval
DISPLAY_VALUE_CHARS = 64
DISPLAY_CHARS = 100  # the length of Rejection.display
PRUNE_EVERY = 3600.0  # seconds between two prunes by the flush of one process
OVERFLOW_KEY = "~other"  # never a digest, whose alphabet is A-Z a-z 0-9 - _
OVERFLOW_DISPLAY = "(other clients)"
UNKNOWN_IDENTITY = "unknown"

# C0 and C1 controls, zero-width and bidirectional formatting characters.
_HIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_VALUE_KINDS = (KeyKind.HEADER, KeyKind.PARAM, KeyKind.CUSTOM)

Entry = tuple[str, str, str, int]  # rule name, key digest, action, minute (Unix seconds)


def display_of(identity: str) -> str:
    """The identity as the dashboard shows it: values cut short, invisible characters removed."""
    kind, sep, value = identity.partition(":")
    if sep and kind in _VALUE_KINDS:
        value = _HIDDEN.sub("", value)
        if len(value) > DISPLAY_VALUE_CHARS:
            value = value[:DISPLAY_VALUE_CHARS] + "\u2026"
        return f"{kind}:{value}"
    return _HIDDEN.sub("", identity)[:DISPLAY_CHARS]


def is_complete(display: str, key: str) -> bool:
    """Whether a stored display form is the whole identity (so it can be inspected and reset)."""
    return key != OVERFLOW_KEY and digest(display) == key


class RejectionLog:
    """This process's buffer of rejection counts, and its flusher thread."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._init()

    def _init(self) -> None:
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._counts: dict[Entry, list[Any]] = {}  # entry -> [count, display]
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._next_prune = 0.0
        self._failing = False
        self.overflowed = 0  # rejections counted under OVERFLOW_KEY since the process started

    def __len__(self) -> int:
        return len(self._counts)

    @property
    def pending(self) -> int:
        """Rejections buffered, not yet persisted."""
        with self._lock:
            return sum(entry[0] for entry in self._counts.values())

    def add(self, rule: str, identity: str, action: str, when: float | None = None) -> None:
        minute = int(time.time() if when is None else when) // 60 * 60
        key = digest(identity)
        with self._lock:
            self._count((rule, key, action, minute), 1, identity, None)
            if self._thread is None:
                self._start()

    def _count(self, entry: Entry, n: int, identity: str | None, display: str | None) -> None:
        counts = self._counts
        slot = counts.get(entry)
        if slot is None:
            if len(counts) >= self.max_keys and entry[1] != OVERFLOW_KEY:
                self.overflowed += n
                entry = (entry[0], OVERFLOW_KEY, entry[2], entry[3])
                slot = counts.get(entry)
                display = OVERFLOW_DISPLAY
            if slot is None:
                if display is None:
                    display = display_of(identity or UNKNOWN_IDENTITY)
                slot = counts[entry] = [0, display]
        slot[0] += n

    # -- the flusher thread ---------------------------------------------------------

    def _start(self) -> None:
        thread = threading.Thread(
            target=self._run, args=(self._stop,), name="django_throttle-flush", daemon=True
        )
        self._thread = thread
        thread.start()

    def _run(self, stop: threading.Event) -> None:
        me = threading.current_thread()
        try:
            while not stop.wait(conf.FLUSH_INTERVAL):  # set by discard(), which forgets us
                self.flush()
                with self._lock:
                    # Decided under the lock: add() starts a new thread once this one is gone.
                    if not self._counts:
                        if self._thread is me:
                            self._thread = None
                        return
        finally:
            with self._lock:
                if self._thread is me:  # ended by an unexpected error: the next add() restarts
                    self._thread = None
            connections.close_all()  # this thread's own connections

    def _after_fork(self) -> None:
        # The parent flushes what it buffered; the child starts empty, without a thread.
        self._init()

    def discard(self) -> None:
        """Forget the buffered counts and stop the flusher thread (for tests)."""
        with self._lock:
            self._counts.clear()
            thread, self._thread = self._thread, None
            self._stop.set()
            self._stop = threading.Event()
            self._next_prune = 0.0
            self.overflowed = 0
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    # -- persisting -------------------------------------------------------------------

    def flush(self) -> int:
        """Persist the buffered counts now (and prune if due); return the rows written."""
        with self._flush_lock:
            with self._lock:
                counts, self._counts = self._counts, {}
            if counts:
                try:
                    write(counts)
                except Exception as exc:
                    self._keep(counts)
                    if not self._failing:
                        self._failing = True
                        logger.error(
                            "django_throttle: could not persist %d rejection counts (%s); "
                            "keeping them for the next flush",
                            len(counts),
                            exc,
                        )
                    return 0
                if self._failing:
                    self._failing = False
                    logger.warning("django_throttle: rejection counts are persisted again")
            if time.monotonic() >= self._next_prune:
                self._next_prune = time.monotonic() + PRUNE_EVERY
                try:
                    prune()
                except Exception as exc:
                    logger.error("django_throttle: could not prune the rejection log (%s)", exc)
            return len(counts)

    def _keep(self, counts: dict[Entry, list[Any]]) -> None:
        with self._lock:
            for entry, (n, display) in counts.items():
                self._count(entry, n, None, display)


rejection_log = RejectionLog()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=rejection_log._after_fork)


@atexit.register
def _flush_at_exit() -> None:
    if len(rejection_log):
        # The interpreter is going away: if the database cannot be reached, nothing can be done.
        with contextlib.suppress(Exception):
            rejection_log.flush()


def flush() -> int:
    """Persist this process's buffered rejection counts now; return the rows written."""
    return rejection_log.flush()


# -- from a decision to counts ------------------------------------------------------------

_note_failed = False


def note(decision: Decision) -> None:
    """Count the rejections of one decision (free when it admitted and no shadow rule would
    have rejected)."""
    if decision.allowed:
        for result in decision.results:
            if not result.allowed:
                break
        else:
            return
    try:
        _note(decision)
    except Exception:
        global _note_failed
        if not _note_failed:
            _note_failed = True
            logger.exception("django_throttle: a rejection could not be recorded")


def _note(decision: Decision) -> None:
    if decision.unavailable and decision.rule is not None:
        rejection_log.add(decision.rule, decision.identity or UNKNOWN_IDENTITY, UNAVAILABLE)
    elif not decision.allowed:
        for result in decision.results:
            rule = result.rule
            if rule.name == decision.rule and not result.allowed and rule.enforcing:
                rejection_log.add(rule.name, result.identity, REJECT)
                break
    for result in decision.results:
        if not result.allowed and not result.rule.enforcing:
            rejection_log.add(result.rule.name, result.identity, SHADOW)


# -- the database ---------------------------------------------------------------------------

_FIELDS = ("rule", "key", "display", "action", "minute", "count")
_UNIQUE = ("rule", "key", "action", "minute")


def _minute(epoch: int) -> datetime:
    value = datetime.fromtimestamp(epoch, tz=timezone.utc)
    return value if settings.USE_TZ else django_timezone.make_naive(value)


def write(counts: dict[Entry, list[Any]], upsert: bool | None = None) -> None:
    """Add these counts to the rejection log, in one transaction."""
    using = router.db_for_write(Rejection)
    connection = connections[using]
    rows = [
        (rule, key, display, action, _minute(minute), n)
        for (rule, key, action, minute), (n, display) in counts.items()
    ]
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
    """INSERT ... ON CONFLICT DO UPDATE SET count = count + excluded.count, in batches."""
    meta = Rejection._meta
    quote = connection.ops.quote_name
    fields = [_column(name) for name in _FIELDS]
    table = quote(meta.db_table)
    columns = ", ".join(quote(f.column) for f in fields)
    target = ", ".join(quote(_column(name).column) for name in _UNIQUE)
    count = quote(_column("count").column)
    placeholders = "(" + ", ".join(["%s"] * len(fields)) + ")"
    size = max(1, connection.ops.bulk_batch_size(fields, rows) or len(rows))
    with connection.cursor() as cursor:
        for start in range(0, len(rows), size):
            batch = rows[start : start + size]
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES {', '.join([placeholders] * len(batch))} "
                f"ON CONFLICT ({target}) DO UPDATE SET {count} = {table}.{count} + EXCLUDED.{count}",
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
            row.count += new[5]
            changed.append(row)
    if changed:
        manager.bulk_update(changed, ["count"])
    if wanted:
        manager.bulk_create(
            [Rejection(**dict(zip(_FIELDS, r, strict=True))) for r in wanted.values()]
        )


def prune(days: int | None = None) -> int:
    """Delete the rejection counts older than ``days`` (default RETENTION_DAYS); return how many."""
    days = conf.RETENTION_DAYS if days is None else days
    cutoff = django_timezone.now() - timedelta(days=days)
    deleted, _ = Rejection.objects.filter(minute__lt=cutoff).delete()
    return deleted
