"""The rejection log: counted in each process's memory, shared through Redis, written to the
database in bulk, compacted as it ages.

Recording must never make throttling slower:

- An admitted request pays nothing: ``note()`` looks at the decision and returns.
- A rejected request pays one dictionary increment under a lock, in this process's
  buffer, keyed by (rule, client, action, minute): no database query, no network call.
  Actions are ``reject`` (429), ``unavailable`` (503: the store is down and the rule
  fails closed) and ``shadow`` (a log-only rule would have rejected).
- The first rejection of a process (again after a fork) starts a daemon thread. With Redis
  as the store, it adds the buffer to one hash in Redis every second (``PUSH_INTERVAL``,
  a script call per 500 counts), and every ``FLUSH_INTERVAL`` seconds it *folds*: takes
  everything every process left in Redis (renamed away in one call, so no count is folded
  twice) and writes it in one bulk statement that *adds* to the rows (``INSERT ... ON
  CONFLICT DO UPDATE SET count = count + n`` on PostgreSQL and SQLite; a locked
  read-modify-write elsewhere). The dashboard and ``throttle_flush`` fold too, so they see
  the counts of every process of the last second. With the memory backend (one process)
  the thread writes the buffer itself every ``FLUSH_INTERVAL``. The thread ends when a
  flush finds nothing new; counts still buffered are handed on at exit.
- Failures keep the counts: while Redis fails, each process writes its own buffer to the
  database; while the database fails, counts stay in the buffer (bounded, below) for the
  next flush. A row the database refuses (a charset, a length) is found by halving the
  batch, and stored with its text escaped to ASCII or, failing that, logged and given up:
  it never holds back the others.
- Bounded: past ``MAX_KEYS`` distinct entries in one interval, and past 200 clients named
  in one minute, all rules together (each rule and action names at least 5 whatever the
  others took; across all processes, decided in Redis), further clients are counted under
  one synthetic client per rule, action and minute, ``(other clients)``, so the totals
  stay right whatever the flood.
- Clients are stored as the store keys them (the digest of the identity) with a display
  form: the identity, with header, parameter and custom values cut to 64 characters,
  control characters removed and lone surrogates replaced. Nothing else of the request is
  kept.
- Rows past the dashboard's hour are merged into quarter hours, and past its day into two
  hours, keeping the largest clients by name within the same bounds per period
  (``compact()``: by each flushing process every five minutes, and by ``throttle_prune``).
  So a period has a bounded number of rows, and so does the table. Rows older than
  ``RETENTION_DAYS`` are deleted by ``throttle_prune`` and by the flush (at most once an
  hour per process).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os

from ..choices import RejectionAction
from ..decision import Decision
from ..runtime import runtime
from ..store import Result
from .buffer import MAX_KEYS, PUSH_INTERVAL, RejectionLog
from .database import (
    LEVELS,
    NAMED_PER_PERIOD,
    NAMED_PER_RULE,
    compact,
    merge_periods,
    prune,
    write,
    write_each,
)
from .text import (
    DISPLAY_CHARS,
    DISPLAY_VALUE_CHARS,
    OVERFLOW_DISPLAY,
    OVERFLOW_KEY,
    UNKNOWN_IDENTITY,
    display_of,
    is_complete,
)

__all__ = (
    "ACTIONS",
    "DISPLAY_CHARS",
    "DISPLAY_VALUE_CHARS",
    "LEVELS",
    "MAX_KEYS",
    "NAMED_PER_PERIOD",
    "NAMED_PER_RULE",
    "OVERFLOW_DISPLAY",
    "OVERFLOW_KEY",
    "PUSH_INTERVAL",
    "REJECT",
    "SHADOW",
    "UNAVAILABLE",
    "RejectionLog",
    "collect",
    "compact",
    "display_of",
    "flush",
    "is_complete",
    "merge_periods",
    "note",
    "prune",
    "rejection_log",
    "write",
    "write_each",
)

logger = logging.getLogger("django_throttle")

REJECT, UNAVAILABLE, SHADOW = (
    RejectionAction.REJECT.value,
    RejectionAction.UNAVAILABLE.value,
    RejectionAction.SHADOW.value,
)
ACTIONS = (REJECT, UNAVAILABLE, SHADOW)


def rejection_log() -> RejectionLog:
    """This process's rejection log (the runtime's)."""
    return runtime().part(RejectionLog)


def _after_fork_in_child() -> None:
    log = runtime().built(RejectionLog)
    if log is not None:
        log._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _flush_at_exit() -> None:
    log = runtime().built(RejectionLog)
    if log is not None and len(log):
        # The interpreter is going away: if neither Redis nor the database can be reached,
        # nothing can be done.
        with contextlib.suppress(Exception):
            log.collect()
            if len(log):  # the database failed: Redis keeps them for another process
                log.push()


def flush() -> int:
    """Write the rejection counts of this process, and those every process handed to Redis,
    to the database now; prune and compact if due. Return the rows written."""
    return rejection_log().flush()


def collect(timeout: float = -1) -> int:
    """Write the rejection counts of this process, and those every process handed to Redis,
    to the database now (no pruning or compaction). Return the rows written. ``timeout``:
    seconds to wait for this process's own collection under way (-1: as long as it takes);
    past it, nothing is done here (that one writes them)."""
    return rejection_log().collect(timeout)


# -- from a decision to counts ------------------------------------------------------------


def note(decision: Decision) -> None:
    """Count the rejections of one decision (free when it admitted and no shadow rule would
    have rejected)."""
    if decision.allowed:
        for result in decision.results:
            if not result.allowed:
                break
        else:
            return
    log = rejection_log()
    try:
        _note(log, decision)
    except Exception:
        if not log.note_failed:
            log.note_failed = True
            logger.exception("django_throttle: a rejection could not be recorded")


def _note(rejection_log: RejectionLog, decision: Decision) -> None:
    if decision.unavailable and decision.rule is not None:
        rejection_log.add(decision.rule, decision.identity or UNKNOWN_IDENTITY, UNAVAILABLE)
    elif not decision.allowed:
        for result in decision.results:
            rule = result.rule
            if rule.name == decision.rule and not result.allowed and rule.enforcing:
                rejection_log.add(rule.name, result.identity, REJECT, _when(result))
                break
    for result in decision.results:
        if not result.allowed and not result.rule.enforcing:
            rejection_log.add(result.rule.name, result.identity, SHADOW, _when(result))


def _when(result: Result) -> float | None:
    """The store's time of the decision: filed under its minute, whatever this host's clock."""
    return result.at / 1_000_000 if result.at else None
