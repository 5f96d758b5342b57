"""Rejection counts shared through Redis (push.lua, take.lua), so a fold sees every process's."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from ..conf import conf
from ..store import get_store
from ..store.errors import STORE_ERRORS
from ..store.shared_counts import CountsLink
from .database import NAMED_PER_PERIOD, NAMED_PER_RULE, Counts, Entry, Sizes
from .display import OVERFLOW_DISPLAY, OVERFLOW_KEY

logger = logging.getLogger("django_throttle")

PUSH_CHUNK = 500  # counts per script call: each call holds Redis for about a millisecond
READ_CHUNK = 1000  # fields per HSCAN reply
NAMED_TTL = 2 * 3600  # seconds a minute's named clients are remembered (late counts included)
FOLD_TTL = 3600  # seconds a taken hash stays, for its folder to read it after a Redis error


class PushFailed(Exception):
    """Redis refused or missed some counts; ``rest`` and ``sizes`` hold those not added."""

    def __init__(self, rest: Counts, cause: BaseException, sizes: Sizes | None = None) -> None:
        super().__init__(str(cause))
        self.rest = rest
        self.sizes: Sizes = sizes or {}
        self.cause = cause


def client() -> CountsLink | None:
    """Where counts are handed on, or None when they stay in the process (the memory
    backend), the store cannot be built, or a breaker says Redis (on a cluster: the master
    of these counts' slot) failed moments ago."""
    return get_store().counts_link(counts_key())


def _base() -> str:
    prefix = conf.KEY_PREFIX
    return f"{prefix}:rej:{{{prefix}}}"


def counts_key() -> str:
    return _base() + ":c"


def named_key(minute: int) -> str:
    return f"{_base()}:n:{minute}"


def field_of(entry: Entry, display: str) -> str:
    rule, key, action, minute = entry
    return json.dumps([minute, rule, action, key, display])


def size_field(rule: str, hour: int, bound: int) -> str:
    return json.dumps(["size", hour, rule, bound])


def push(redis: CountsLink, counts: Counts, sizes: Sizes | None = None) -> int:
    """Add the counts (and the sizing's, which name no client: push.lua adds them as they
    are) to the waiting hash; return how many went to ``(other clients)``.

    Raises PushFailed with the counts not added. A call that timed out may have been run
    all the same: its counts are kept and sent again, so a hung server can count a few
    rejections twice rather than lose them.
    """
    items: list[tuple[Any, Any]] = list(counts.items())
    n_counts = len(items)
    items += (sizes or {}).items()
    ttl = conf.RETENTION_DAYS * 86400 * 1000
    other = 0
    for start in range(0, len(items), PUSH_CHUNK):
        chunk = items[start : start + PUSH_CHUNK]
        minutes: dict[int, int] = {}
        args: list[Any] = [ttl, NAMED_TTL * 1000, NAMED_PER_PERIOD, NAMED_PER_RULE]
        for entry, value in chunk:
            if len(entry) == 3:  # a sizing count: no client to name, no minute's hash
                args += [1, "", "", size_field(*entry), "", value]
                continue
            n, display = value
            rule, key, action, minute = entry
            index = minutes.setdefault(minute, len(minutes) + 2)  # KEYS[1] is the counts
            named = key != OVERFLOW_KEY
            args += [
                index,
                json.dumps([rule, action]),
                json.dumps([rule, action, key]) if named else "",
                field_of(entry, display),
                field_of((rule, OVERFLOW_KEY, action, minute), OVERFLOW_DISPLAY),
                n,
            ]
        keys = [counts_key(), *(named_key(minute) for minute in minutes)]
        try:
            other += int(redis.push(keys, args))
        except STORE_ERRORS as exc:
            rest = max(start, n_counts)
            raise PushFailed(dict(items[start:n_counts]), exc, dict(items[rest:])) from exc
    return other


def take(redis: CountsLink) -> str | None:
    """Take every waiting count for this fold: the key now holding them, or None."""
    key = f"{_base()}:f:{uuid.uuid4().hex}"
    taken = redis.take([counts_key(), key], [FOLD_TTL * 1000])
    return key if taken else None


def read(redis: CountsLink, key: str) -> Counts:
    """The rejection counts under a taken key."""
    return read_all(redis, key)[0]


def read_all(redis: CountsLink, key: str) -> tuple[Counts, Sizes]:
    """The rejection and sizing counts under a taken key. A field that is not ours (another
    version's, or damaged) is skipped and logged: it must not hold back the others."""
    fields: dict[bytes, bytes] = {}
    # HSCAN may return a field twice; the dict keeps one.
    for name, value in redis.scan(key, READ_CHUNK):
        fields[name] = value
    counts: Counts = {}
    sizes: Sizes = {}
    for name, value in fields.items():
        try:
            parsed = json.loads(name)
            if len(parsed) == 4 and parsed[0] == "size":
                size = (str(parsed[2]), int(parsed[1]), int(parsed[3]))
                sizes[size] = sizes.get(size, 0) + int(value)
                continue
            minute, rule, action, client, display = parsed
            entry = (str(rule), str(client), str(action), int(minute))
            n = int(value)
        except (ValueError, TypeError) as exc:
            logger.error("django_throttle: skipped a rejection count it cannot read (%s)", exc)
            continue
        slot = counts.get(entry)
        if slot is None:
            counts[entry] = [n, str(display)]
        else:
            slot[0] += n
    return counts, sizes


def forget(redis: CountsLink, key: str) -> None:
    redis.delete(key)
