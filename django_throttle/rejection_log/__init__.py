"""The rejection log: rejections counted per process, handed through Redis to the database.

Recording never slows a request: a rejection is one increment in memory (docs/internals.md).
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
from .display import (
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
    if log is not None and (len(log) or log.sized):
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
