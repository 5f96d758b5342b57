"""``throttle_task`` with a real Celery worker (an in-process thread) and a Redis broker of its
own: rejected runs go back to the queue with the same id, uncounted retries and jitter, and
never hold a worker slot; a store outage follows the rule's fail mode."""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.exceptions import Retry
from celery.signals import task_retry

from django_throttle import check_key
from django_throttle.contrib.celery import countdown, throttle_task
from django_throttle.decision import Decision
from django_throttle.models import Rule
from tests.conftest import PartnerAPI
from tests.helpers import away_from_midnight, rule
from tests.redis_server import RedisServer

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    # Celery 5.7's Redis result backend calls redis-py's deprecated setex.
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
]


app = Celery("tests.test_celery")
app.conf.update(
    task_always_eager=False,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    result_expires=60,
)


class Runs:
    """What the tasks' bodies saw, appended from the worker's threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, Any, int]] = []  # (task id, argument, request.retries)

    def add(self, task: Any, argument: Any) -> None:
        with self.lock:
            self.seen.append((task.request.id, argument, task.request.retries))

    def clear(self) -> None:
        with self.lock:
            self.seen.clear()


RUNS = Runs()


@app.task(bind=True, max_retries=0)
@throttle_task("tight", key=lambda n: "queue:tight")
def tight(self: Any, n: int) -> int:
    RUNS.add(self, n)
    return n


@app.task(bind=True)
@throttle_task("slow", key=lambda n: "queue:slow")
def slow(self: Any, n: int) -> int:
    RUNS.add(self, n)
    return n


@app.task(bind=True)
def quick(self: Any, n: int) -> int:
    RUNS.add(self, n)
    return n


@app.task(bind=True)
@throttle_task("guarded", key=lambda n: "queue:guarded")
def guarded(self: Any, n: int) -> int:
    RUNS.add(self, n)
    return n


@app.task(bind=True)
@throttle_task("guarded", key=lambda value: value)
def badly_keyed(self: Any, value: Any) -> None:
    RUNS.add(self, value)


@pytest.fixture(scope="module")
def broker() -> Iterator[RedisServer]:
    """The broker and result backend: a server of its own, so pausing the store's leaves it up."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    server = RedisServer()
    server.start()
    app.conf.update(broker_url=server.url, result_backend=server.url)
    app.set_current()
    yield server
    gc.collect()  # results left over unsubscribe from the backend while it still answers
    # Their unsubscribing may open the result consumer's pub/sub connection anew: closed here,
    # not left to the garbage collector in a later test (a ResourceWarning there).
    app.backend.result_consumer.stop()
    app.backend.client.connection_pool.disconnect()
    app.close()
    server.close()
    # A worker sets up logging (the root logger's level to ERROR): the next modules log as before.
    root.setLevel(level)
    root.handlers[:] = handlers


@pytest.fixture
def deferrals() -> Iterator[list[tuple[str, float]]]:
    """(task id, countdown) of every run sent back to the queue."""
    seen: list[tuple[str, float]] = []
    lock = threading.Lock()

    def record(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
        with lock:
            seen.append((request.id, reason.when))

    task_retry.connect(record, weak=False)
    yield seen
    task_retry.disconnect(record)


def worker(broker: RedisServer, **options: Any) -> Any:
    """An in-process worker thread on an empty broker (a message deferred by an earlier test is
    gone)."""
    client = broker.client()
    client.flushall()
    client.close()
    RUNS.clear()
    return start_worker(app, perform_ping_check=False, shutdown_timeout=15, **options)


def wait_for(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# -- the example of docs/usage.md ------------------------------------------------------------


def test_sixteen_parallel_tasks_run_at_most_five_a_second_and_none_is_lost(
    broker: RedisServer,
    partner_api: PartnerAPI,
    deferrals: list[tuple[str, float]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_throttle.contrib import celery as contrib_celery
    from tests.celery_orders.tasks import push_order

    admitted: list[float] = []  # the store's time of each admitting decision
    decide_key = contrib_celery.decide_key

    def observed(*args: Any) -> Decision:
        decision = decide_key(*args)
        if decision.allowed:
            admitted.append(decision.decided_at)
        return decision

    monkeypatch.setattr(contrib_celery, "decide_key", observed)

    rule("partner-api", "partner-api", 5, unit="second", algorithm="sliding_window_log")
    with worker(broker, pool="threads", concurrency=16):
        results = [push_order.delay(n, "acme") for n in range(16)]
        for result in results:
            assert result.get(timeout=20) is None
        assert {result.state for result in results} == {"SUCCESS"}
    assert sorted(partner_api.orders) == [("acme", n) for n in range(16)]  # each once
    # Any 6 admitted runs span a second or more of the store's clock: never 6 in a second.
    times = sorted(admitted)
    assert len(times) == 16
    assert all(times[i + 5] - times[i] >= 1.0 - 1e-6 for i in range(len(times) - 5))
    assert times[-1] - times[0] < 8  # deferred to each turn, not much later
    assert deferrals  # (how many depends on how fast the worker takes the 16)
    # A deferred run keeps its task id: the result of the first call is the task's.
    assert {task_id for task_id, _ in deferrals} <= {result.id for result in results}


def test_the_acquire_example_waits_for_a_turn_or_retries_later(partner_api: PartnerAPI) -> None:
    """orders/tasks.py of "Limits without a request", called as a worker calls its body."""
    from tests.celery_orders.acquire_tasks import push_order

    rule("partner-api", "partner-api", 1, unit="second", algorithm="sliding_window_log")
    push_order(1, "acme")
    push_order(2, "acme")  # waits in acquire() for the second's turn, well within 2 s
    assert partner_api.orders == [("acme", 1), ("acme", 2)]
    Rule.objects.filter(name="partner-api").update(unit="minute")
    with pytest.raises(Retry):  # no turn within 2 s: back to the queue, nothing sent
        push_order(3, "acme")
    assert partner_api.orders == [("acme", 1), ("acme", 2)]


def test_the_partners_busy_answer_is_partner_busy(partner_api: PartnerAPI) -> None:
    from tests.celery_orders.partners import PartnerBusy, send_order

    partner_api.status = 503
    with pytest.raises(PartnerBusy):
        send_order("acme", 7)


def test_a_summary_made_in_a_task_is_charged_to_its_user() -> None:
    """chat/tasks.py of "Costs known after the response": the stand-in model's tokens."""
    from tests.recipes.chat_site.chat.tasks import summarize

    rule("chat-tokens", "/chat/", 10, key_kind="user", unit="day", algorithm="fixed_window")
    away_from_midnight()
    assert summarize(42, "the long report") == "Summarize: the long report"
    assert check_key("/chat/", "user:42", dry_run=True).remaining == 10 - 4  # 4 words


# -- deferral: retries, jitter, no worker slot -----------------------------------------------


def test_deferrals_do_not_use_up_max_retries_and_come_back_jittered(
    broker: RedisServer, deferrals: list[tuple[str, float]]
) -> None:
    rule("tight", "tight", 1, unit="second", algorithm="fixed_window")
    with worker(broker, pool="threads", concurrency=4):
        results = [tight.delay(n) for n in range(5)]
        assert sorted(result.get(timeout=20) for result in results) == [0, 1, 2, 3, 4]
    # One run a window, and a deferred run comes back in the next window: the last of the 5
    # (all sent in the first window or the next) was deferred 3 times or more. With
    # max_retries=0, it ran, and saw retries 0.
    per_task = [sum(1 for task_id, _ in deferrals if task_id == r.id) for r in results]
    assert max(per_task) >= 3
    assert sorted(n for _, n, _ in RUNS.seen) == [0, 1, 2, 3, 4]
    assert {retries for _, _, retries in RUNS.seen} == {0}
    assert {task_id for task_id, _, _ in RUNS.seen} == {result.id for result in results}
    # Each countdown is the retry time plus its own jitter: no two alike, none past 1.1 s.
    countdowns = [when for _, when in deferrals]
    assert len(set(countdowns)) == len(countdowns)
    assert all(0 < when <= 1.1 for when in countdowns)


def test_the_jitter_is_a_tenth_of_the_retry_time_at_least_a_tenth_of_a_second() -> None:
    short = [countdown(Decision(allowed=False, retry_after=0.3)) for _ in range(200)]
    assert all(0.3 <= when <= 0.4 for when in short)
    long = [countdown(Decision(allowed=False, retry_after=20.0)) for _ in range(200)]
    assert all(20.0 <= when <= 22.0 for when in long)
    assert max(long) - min(long) > 1.0  # spread over the range, not a constant
    assert len(set(short)) == len(short)


# The deferred task's result, collected after the worker stopped, unsubscribes through Celery's
# result consumer; when that finds its pub/sub connection broken it resets redis-py's pool, which
# forgets the connection without closing it (redis-py 5.0), and the garbage collector reports the
# socket (a ResourceWarning). Neither library's socket is a behaviour of throttle_task.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_deferred_task_holds_no_worker_slot(
    broker: RedisServer, deferrals: list[tuple[str, float]]
) -> None:
    # A sliding log: the retry time is a minute from the first run, wherever the clock's
    # minute boundary falls (a fixed window near its end would defer for under a second).
    rule("slow", "slow", 1, unit="minute", algorithm="sliding_window_log")
    with worker(broker, pool="solo", concurrency=1):
        assert slow.delay(0).get(timeout=10) == 0
        waiting = slow.delay(1)  # deferred until a minute after the first run
        wait_for(lambda: len(deferrals) == 1, 10)
        started = time.monotonic()
        # The one worker slot runs the queue's other tasks meanwhile.
        assert [quick.delay(n).get(timeout=10) for n in range(2, 7)] == [2, 3, 4, 5, 6]
        assert time.monotonic() - started < 5
        assert waiting.state == "RETRY"
        assert [n for _, n, _ in RUNS.seen] == [0, 2, 3, 4, 5, 6]
        assert deferrals[0][1] > 5  # its turn is a minute after the first run


# -- store outages follow the rule's fail mode -----------------------------------------------


@pytest.fixture
def short_timeouts(settings: Any) -> None:
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "TIMEOUT": 0.2,
        "CONNECT_TIMEOUT": 0.2,
        "BREAKER_INTERVAL": 0.5,
    }


@pytest.mark.usefixtures("short_timeouts")
# A connection to the paused store that timed out in a worker thread is sometimes left for the
# garbage collector (a ResourceWarning then); not a behaviour of throttle_task.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_fail_closed_task_waits_out_an_outage_then_runs(
    broker: RedisServer, redis_server: RedisServer, deferrals: list[tuple[str, float]]
) -> None:
    rule("guarded", "guarded", 100, unit="second", fail_mode="closed")
    assert check_key("guarded", "warm-up", dry_run=True).allowed  # the rules are loaded
    with worker(broker, pool="threads", concurrency=2):
        redis_server.pause()
        try:
            result = guarded.delay(1)
            wait_for(lambda: len(deferrals) >= 2, 10)
            assert RUNS.seen == []
            assert result.state == "RETRY"
        finally:
            redis_server.resume()
        assert result.get(timeout=10) == 1
    assert [(task_id, n) for task_id, n, _ in RUNS.seen] == [(result.id, 1)]
    # Back by the time the breaker probes the store (a retry time is at least 1 s).
    assert all(when <= 1.1 for _, when in deferrals)


@pytest.mark.usefixtures("short_timeouts")
def test_a_fail_open_task_runs_during_an_outage(
    broker: RedisServer, redis_server: RedisServer, deferrals: list[tuple[str, float]]
) -> None:
    rule("guarded", "guarded", 100, unit="second", fail_mode="open")
    assert check_key("guarded", "warm-up", dry_run=True).allowed
    with worker(broker, pool="threads", concurrency=2):
        redis_server.pause()
        try:
            assert guarded.delay(1).get(timeout=10) == 1
        finally:
            redis_server.resume()
    assert deferrals == []


# -- mistakes are named ----------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", 42])
def test_a_key_that_is_not_a_non_empty_string_fails_the_task_clearly(
    broker: RedisServer, value: Any
) -> None:
    with worker(broker):
        result = badly_keyed.delay(value)
        with pytest.raises(ValueError, match="must return a non-empty string"):
            result.get(timeout=10)
    assert result.state == "FAILURE"
    assert RUNS.seen == []


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("", lambda: "k"), "scope must be a non-empty string"),
        (("s", "partner:acme"), "key must be a callable"),
        (("s", lambda: "k", 0), "cost"),
    ],
)
def test_bad_arguments_are_named(arguments: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        throttle_task(*arguments)


def test_arguments_are_checked_against_the_task_function_when_sent(broker: RedisServer) -> None:
    with pytest.raises(TypeError):
        tight.delay(1, 2)


def test_called_directly_or_eagerly_a_rejected_run_raises_retry_and_does_not_run(
    broker: RedisServer,
) -> None:
    rule("tight", "tight", 1, unit="minute", algorithm="sliding_window_log")
    RUNS.clear()
    assert tight(1) == 1
    with pytest.raises(Retry):
        tight(2)
    eager = tight.apply(args=(3,))
    assert eager.state == "RETRY"
    assert [n for _, n, _ in RUNS.seen] == [1]
