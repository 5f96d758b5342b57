"""This process's buffer of rejection counts, and the thread that hands them on."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from typing import Any

from django.db import connections

from .. import metrics
from ..conf import conf
from ..runtime import Runtime
from ..state_keys import digest
from ..store import Result
from ..store.errors import STORE_ERRORS
from . import through_redis
from .database import (
    NAMED_PER_PERIOD,
    NAMED_PER_RULE,
    Counts,
    Entry,
    Size,
    Sizes,
    compact,
    prune,
    write_each,
    write_sizes,
)
from .display import OVERFLOW_DISPLAY, OVERFLOW_KEY, display_of

logger = logging.getLogger("django_throttle")

MAX_KEYS = 10_000  # distinct (rule, client, action, minute) entries buffered per interval
PUSH_INTERVAL = 1.0  # seconds between two pushes to Redis (at most FLUSH_INTERVAL)
PRUNE_EVERY = 3600.0  # seconds between two prunes by the flush of one process
COMPACT_EVERY = 300.0  # seconds between two compactions by the flush of one process
COMPACT_SECONDS = 5.0  # a flush spends at most about this long compacting; the next goes on
NAMED_SECONDS = 2 * 3600  # how long the buffer remembers the clients it named in a minute

_DATABASE, _REDIS = "database", "redis"


def window_hour(result: Result) -> int:
    """The hour in which a fixed window's result's window started: every boundary of one
    client window is counted in one row (sizing.py)."""
    rule = result.rule
    if rule.calendar is None and result.at:
        now = int(result.at) // 1_000_000
        start = now - now % rule.period
    else:  # a week or month: its start is where it ends less its length
        start = round(result.reset_at) - rule.period
    return start - start % 3600


class _Names:
    """The clients this process named in one minute."""

    __slots__ = ("members", "per_rule")

    def __init__(self) -> None:
        self.members: set[tuple[str, str, str]] = set()  # (rule, action, key)
        self.per_rule: dict[tuple[str, str], int] = {}  # (rule, action) -> how many


class RejectionLog:
    """This process's buffer of rejection counts, and its flusher thread."""

    def __init__(
        self,
        max_keys: int = MAX_KEYS,
        named: int = NAMED_PER_PERIOD,
        named_per_rule: int = NAMED_PER_RULE,
    ) -> None:
        self.max_keys = max_keys
        self.named = named
        self.named_per_rule = named_per_rule
        self._init()

    def _init(self) -> None:
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._maintain_lock = threading.Lock()
        self._counts: Counts = {}
        self._sizes: Sizes = {}  # the sizing's counts (sizing.py), handed on with the others
        # The results whose count reached a boundary, summed into _sizes by the flusher: an
        # append is atomic, so a request pays no lock, and its sum is made off its path.
        self.crossed: deque[Result] = deque()
        self._named: dict[int, _Names] = {}  # minute -> the clients named in it
        self.thread: threading.Thread | None = None  # the flusher, while it runs
        self._stop = threading.Event()
        self._active = False  # a rejection was counted since the last flush began
        self._next_prune = 0.0
        self._next_compact = time.monotonic() + COMPACT_EVERY
        self._held: str | None = None  # counts taken from Redis, not yet read (Redis failed)
        self._failing: set[str] = set()
        self.overflowed = 0  # rejections counted under OVERFLOW_KEY since the process started
        self.dropped = 0  # rejections the database refused even escaped (logged each time)
        self.note_failed = False  # a decision could not be counted: said once

    def __len__(self) -> int:
        return len(self._counts)

    @property
    def pending(self) -> int:
        """Rejections buffered, not yet handed on."""
        with self._lock:
            return sum(entry[0] for entry in self._counts.values())

    def add(self, rule: str, identity: str, action: str, when: float | None = None) -> None:
        minute = int(time.time() if when is None else when) // 60 * 60
        key = digest(identity)
        with self._lock:
            self._active = True
            self._count((rule, key, action, minute), identity)
            if self.thread is None:
                self._start()

    @property
    def sized(self) -> bool:
        """Whether sizing counts wait to be handed on."""
        return bool(self._sizes or self.crossed)

    def add_sizes(self, found: list[tuple[Size, int]]) -> None:
        """Add the sizing's counts of one decision (bounded: rules x hours x boundaries)."""
        with self._lock:
            self._active = True
            sizes = self._sizes
            for size, n in found:
                sizes[size] = sizes.get(size, 0) + n
            if self.thread is None:
                self._start()

    def wake(self) -> None:
        """Start the flusher for the boundaries crossed, unless it runs."""
        with self._lock:
            self._active = True
            if self.thread is None:
                self._start()

    def _drain(self) -> None:
        crossed = self.crossed
        if not crossed:
            return
        sizes: Sizes = {}
        rule, second, hour = None, 0, 0
        for _ in range(len(crossed)):  # appends made meanwhile wait for the next drain
            try:
                result = crossed.popleft()
            except IndexError:  # drained by a handover at the same time
                break
            # One rule's results of one second are of one window: its hour found once.
            if result.rule is not rule or result.at // 1_000_000 != second or not second:
                rule, second = result.rule, result.at // 1_000_000
                hour = window_hour(result)
            size = (rule.name, hour, result.limit - result.remaining)
            sizes[size] = sizes.get(size, 0) + 1
        self._keep_sizes(sizes)

    def _keep_sizes(self, sizes: Sizes) -> None:
        with self._lock:
            buffered = self._sizes
            for size, n in sizes.items():
                buffered[size] = buffered.get(size, 0) + n

    def _swap_sizes(self) -> Sizes:
        self._drain()
        with self._lock:
            sizes, self._sizes = self._sizes, {}
            return sizes

    def _count(self, entry: Entry, identity: str) -> None:
        counts = self._counts
        slot = counts.get(entry)
        if slot is None:
            rule, key, action, minute = entry
            if len(counts) >= self.max_keys or not self._name(rule, key, action, minute):
                self.overflowed += 1
                entry = (rule, OVERFLOW_KEY, action, minute)
                slot = counts.get(entry)
                if slot is None:
                    slot = counts[entry] = [0, OVERFLOW_DISPLAY]
            else:
                slot = counts[entry] = [0, display_of(identity)]
        slot[0] += 1

    def _name(self, rule: str, key: str, action: str, minute: int) -> bool:
        """Whether this client is one of those named in its minute (the bounds of
        database.NAMED_PER_PERIOD, as push.lua applies them across processes)."""
        names = self._named.get(minute)
        if names is None:
            names = self._named[minute] = _Names()
        member = (rule, action, key)
        if member in names.members:
            return True
        taken = names.per_rule.get((rule, action), 0)
        if taken >= self.named_per_rule and len(names.members) >= self.named:
            return False
        names.members.add(member)
        names.per_rule[(rule, action)] = taken + 1
        return True

    def _keep(self, counts: Counts) -> None:
        """Take back counts that could not be handed on (already named or not)."""
        with self._lock:
            buffered = self._counts
            for entry, (n, display) in counts.items():
                slot = buffered.get(entry)
                if slot is None and len(buffered) >= self.max_keys and entry[1] != OVERFLOW_KEY:
                    self.overflowed += n
                    entry = (entry[0], OVERFLOW_KEY, entry[2], entry[3])
                    slot = buffered.get(entry)
                    display = OVERFLOW_DISPLAY
                if slot is None:
                    buffered[entry] = [n, display]
                else:
                    slot[0] += n

    def _swap(self) -> Counts:
        with self._lock:
            counts, self._counts = self._counts, {}
            return counts

    # -- as the runtime's part ------------------------------------------------------

    def handover(self, successor: Runtime) -> None:
        """The settings changed: the counts not yet handed on go to the new runtime's log."""
        counts, sizes = self._swap(), self._swap_sizes()
        if counts or sizes:
            log = successor.part(RejectionLog)
            log._keep(counts)
            log._keep_sizes(sizes)
            with log._lock:
                log._active = True
                if log.thread is None:
                    log._start()

    def close(self) -> None:
        """Stop the flusher thread (a new runtime's log took over what was pending)."""
        self.discard()

    # -- the flusher thread ---------------------------------------------------------

    def _start(self) -> None:
        thread = threading.Thread(
            target=self._run, args=(self._stop,), name="django_throttle-flush", daemon=True
        )
        self.thread = thread
        thread.start()

    def _tick(self) -> float:
        # Each tick sums the boundaries crossed, which keeps their queue short.
        return min(PUSH_INTERVAL, conf.FLUSH_INTERVAL)

    def _run(self, stop: threading.Event) -> None:
        me = threading.current_thread()
        try:
            next_flush = time.monotonic() + conf.FLUSH_INTERVAL
            while not stop.wait(self._tick()):  # set by discard(), which forgets us
                if time.monotonic() < next_flush:
                    self.push()
                    continue
                with self._lock:
                    self._active = False
                self.flush()
                next_flush = time.monotonic() + conf.FLUSH_INTERVAL
                with self._lock:
                    # Decided under the lock: add() starts a new thread once this one is gone.
                    # Counts taken from Redis and not read yet (it failed) keep it going.
                    if (
                        not self._counts
                        and not self._sizes
                        and not self.crossed
                        and not self._active
                        and self._held is None
                    ):
                        if self.thread is me:
                            self.thread = None
                        return
        finally:
            with self._lock:
                if self.thread is me:  # ended by an unexpected error: the next add() restarts
                    self.thread = None
            connections.close_all()  # this thread's own connections

    def _after_fork(self) -> None:
        # The parent hands on what it buffered; the child starts empty, without a thread.
        self._init()

    def discard(self) -> None:
        """Forget the buffered counts and stop the flusher thread (for tests)."""
        with self._lock:
            self._counts.clear()
            self._sizes.clear()
            self.crossed.clear()
            self._named.clear()
            thread, self.thread = self.thread, None
            self._stop.set()
            self._stop = threading.Event()
            self._active = False
            self._next_prune = 0.0
            self._next_compact = time.monotonic() + COMPACT_EVERY
            self._held = None
            self._failing.clear()
            self.overflowed = 0
            self.dropped = 0
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    # -- handing counts on -------------------------------------------------------------

    def push(self) -> None:
        """Add this process's counts to those waiting in Redis (with the memory backend, or
        while Redis fails, they stay here for the next flush)."""
        self._drain()
        redis = through_redis.client()
        if redis is None:
            return
        with self._flush_lock:
            counts, sizes = self._swap(), self._swap_sizes()
            if counts or sizes:
                counts, sizes = self._push(redis, counts, sizes)
                self._keep(counts)
                self._keep_sizes(sizes)

    def collect(self, timeout: float = -1) -> int:
        """Write this process's counts and those every process left in Redis to the database;
        return the rows written. ``timeout``: seconds to wait for a collection of this process
        already under way (then it returns 0: that one writes them); -1 waits."""
        if not self._flush_lock.acquire(timeout=timeout):
            return 0
        try:
            return self._collect()
        finally:
            self._flush_lock.release()

    def flush(self) -> int:
        """``collect()``, then prune and compact the log when due; return the rows written."""
        with self._flush_lock:
            written = self._collect()
        # Outside the lock: a dashboard collecting meanwhile does not wait for a compaction.
        if self._maintain_lock.acquire(blocking=False):
            try:
                self._maintain()
            finally:
                self._maintain_lock.release()
        return written

    def _collect(self) -> int:
        counts, sizes = self._swap(), self._swap_sizes()
        redis = through_redis.client()
        written = 0
        if (counts or sizes) and redis is not None:
            counts, sizes = self._push(redis, counts, sizes)
        if counts:  # the memory backend; or Redis failed: this process writes its own
            written += self._persist(counts)
        if sizes:
            self._persist_sizes(sizes)
        if redis is not None:
            written += self._fold(redis)
        self._forget_named()
        return written

    def _push(self, redis: Any, counts: Counts, sizes: Sizes) -> tuple[Counts, Sizes]:
        """Counts not added to Redis (none when all were)."""
        try:
            self.overflowed += through_redis.push(redis, counts, sizes)
        except through_redis.PushFailed as exc:
            self._failed(
                _REDIS,
                "could not hand %d rejection counts and %d sizing counts to Redis (%s); this "
                "process writes its own to the database meanwhile",
                len(exc.rest),
                len(exc.sizes),
                exc.cause,
            )
            return exc.rest, exc.sizes
        self._recovered(_REDIS, "rejection counts go through Redis again")
        return {}, {}

    def _fold(self, redis: Any) -> int:
        key = self._held
        try:
            if key is None:
                key = through_redis.take(redis)
                if key is None:
                    return 0
                self._held = key
            counts, sizes = through_redis.read_all(redis, key)
        except STORE_ERRORS as exc:
            self._failed(_REDIS, "could not read the rejection counts in Redis (%s)", exc)
            return 0
        self._held = None  # read: from now on, this process answers for them
        self._recovered(_REDIS, "rejection counts go through Redis again")
        written = self._persist(counts) if counts else 0
        if sizes:
            self._persist_sizes(sizes)
        # Written (or kept here) already: if the delete fails, the key expires after FOLD_TTL.
        with contextlib.suppress(*STORE_ERRORS):
            through_redis.forget(redis, key)
        return written

    def _persist(self, counts: Counts) -> int:
        try:
            done = write_each(counts)
        except Exception as exc:
            self._keep(counts)
            metrics.log_flushed(False)
            self._failed(
                _DATABASE,
                "could not persist %d rejection counts (%s); keeping them for the next flush",
                len(counts),
                exc,
            )
            return 0
        metrics.log_flushed(True)
        self._recovered(_DATABASE, "rejection counts are persisted again")
        if done.kept:
            self._keep(done.kept)
        for (rule, key, action, minute), n, error in done.dropped:
            self.dropped += n
            logger.error(
                "django_throttle: the database refused the %d %s rejection(s) of client %s "
                "under rule %r at %d, even escaped (%s); they are not recorded",
                n,
                action,
                key,
                rule,
                minute,
                error,
            )
        return done.rows

    def _persist_sizes(self, sizes: Sizes) -> None:
        try:
            write_sizes(sizes)
        except Exception as exc:
            self._keep_sizes(sizes)
            self._failed(
                _DATABASE,
                "could not persist %d sizing counts (%s); keeping them for the next flush",
                len(sizes),
                exc,
            )

    def _maintain(self) -> None:
        now = time.monotonic()
        if now >= self._next_prune:
            self._next_prune = now + PRUNE_EVERY
            try:
                prune()
            except Exception as exc:
                logger.error("django_throttle: could not prune the rejection log (%s)", exc)
        if now >= self._next_compact:
            self._next_compact = now + COMPACT_EVERY
            try:
                compact(seconds=COMPACT_SECONDS)
            except Exception as exc:  # e.g. another process compacting the same rows on SQLite
                logger.warning("django_throttle: could not compact the rejection log (%s)", exc)

    def _forget_named(self) -> None:
        oldest = time.time() - NAMED_SECONDS
        with self._lock:
            for minute in [m for m in self._named if m < oldest]:
                del self._named[minute]

    def _failed(self, what: str, message: str, *args: Any) -> None:
        if what not in self._failing:
            self._failing.add(what)
            logger.error("django_throttle: " + message, *args)

    def _recovered(self, what: str, message: str) -> None:
        if what in self._failing:
            self._failing.discard(what)
            logger.warning("django_throttle: %s", message)
