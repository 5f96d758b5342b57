"""Many processes racing at one key never admit more than the limit: decisions are atomic."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_throttle.store import state_key
from tests.engine_helpers import ALGORITHMS, HOUR, make_rule, race, start_racer

PROCESSES = 8
ATTEMPTS = 40  # each: 320 in all
LIMIT = 50
DAY = 86400


@pytest.fixture(scope="module")
def workers() -> Iterator[Any]:
    """PROCESSES processes, kept for the module (starting them is the slow part).

    Each task blocks at the barrier until all PROCESSES tasks have started, so
    a worker never takes two tasks of one race.
    """
    context = multiprocessing.get_context("spawn")
    pool = context.Pool(PROCESSES, initializer=start_racer, initargs=(context.Barrier(PROCESSES),))
    yield pool
    pool.close()
    pool.join()


def window(seconds: int, period: int) -> int:
    return seconds // period


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_racing_processes_admit_exactly_the_limit(workers, redis_server, redis_client, algorithm):
    # Nothing may refill during the race, or an extra request could be admitted fairly:
    # - buckets: 50 per hour, so one token (or one slot) comes back every 72 s;
    # - sliding log: no entry leaves the trailing hour during the race;
    # - sliding counter: 50 per hour; were the race to cross the hour, the k requests of the
    #   previous window would still weigh k * (3600 - e) / 3600 after e seconds, freeing a
    #   request only once k * e / 3600 >= 1, so e >= 72 s;
    # - fixed window: a day-long window, and the race must not cross midnight UTC (checked).
    # A race of 320 decisions takes well under a second; the test waits out the last 30 s of
    # a window rather than race across its end.
    period = DAY if algorithm == "fixed_window" else HOUR
    rule = make_rule(algorithm, limit=LIMIT, period=period)
    identity = "ip:203.0.113.7"
    seconds, _ = redis_client.time()
    if period - seconds % period < 30:
        time.sleep(period - seconds % period)
    before, _ = redis_client.time()

    counts = workers.starmap(
        race, [(redis_server.url, rule, identity, ATTEMPTS)] * PROCESSES, chunksize=1
    )

    after, _ = redis_client.time()
    assert window(before, period) == window(after, period)
    assert len(counts) == PROCESSES
    assert sum(counts) == LIMIT
    key = state_key(rule, identity)
    if algorithm == "sliding_window_log":
        assert redis_client.zcard(key) == LIMIT
    elif algorithm in ("fixed_window", "sliding_window_counter"):
        key = f"{key}:{window(before, period)}"  # a key per window, counted exactly
        assert int(redis_client.get(key)) == LIMIT
    assert redis_client.pttl(key) > 0
