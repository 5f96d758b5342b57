"""Limits without a request: ``check_key()`` / ``acheck_key()`` for an explicit key, and
``acquire()`` / ``aacquire()``, which wait for a slot; several OS processes share one limit."""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from typing import Any

import pytest
import redis
from django.db import connection

from django_throttle import aacquire, acheck_key, acquire, check_key
from django_throttle.models import Override, Rejection
from django_throttle.rejection_log import flush
from tests.engine_helpers import acquire_worker
from tests.helpers import rule, run, window_keys

pytestmark = pytest.mark.django_db


def test_check_key_applies_the_scope_s_rules_whatever_their_key_kind() -> None:
    rule("per-ip", "partner-api", 2, key_kind="ip", algorithm="fixed_window")
    rule("per-user", "partner-api", 5, key_kind="user", algorithm="fixed_window")
    decisions = [check_key("partner-api", "partner:acme") for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    assert decisions[-1].rule == "per-ip"
    assert check_key("partner-api", "partner:other").allowed  # another key, its own counter


def test_check_key_uses_code_defaults_and_overrides(
    django_capture_on_commit_callbacks: Any,
) -> None:
    from django_throttle import throttle

    throttle("keyed-default", rate="2/m")
    assert [check_key("keyed-default", "tenant:1").allowed for _ in range(3)] == [
        True,
        True,
        False,
    ]
    limited = rule("tenants", "tenants", 1, algorithm="fixed_window")
    with django_capture_on_commit_callbacks(execute=True):
        Override.objects.create(rule=limited, key="tenant:big", limit=3)
        Override.objects.create(rule=limited, key="tenant:free", exempt=True)
    assert [check_key("tenants", "tenant:big").allowed for _ in range(4)] == [True] * 3 + [False]
    assert all(check_key("tenants", "tenant:free").allowed for _ in range(5))


def test_a_dry_run_counts_nothing_and_rejections_are_recorded() -> None:
    rule("jobs", "jobs", 1, algorithm="fixed_window")
    assert check_key("jobs", "queue:emails", dry_run=True).remaining == 1
    assert check_key("jobs", "queue:emails").allowed
    assert not check_key("jobs", "queue:emails").allowed
    flush()
    assert Rejection.objects.get(rule="jobs").display == "queue:emails"


def test_a_scope_without_rules_admits_and_counts_nothing(redis_client: Any) -> None:
    assert check_key("nothing-here", "tenant:1").allowed
    assert redis_client.keys("thr:*}") == [] and window_keys(redis_client) == []


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("", "k"), "scope must be a non-empty string"),
        (("s", ""), "key must be a non-empty string"),
        (("s", None), "key must be a non-empty string"),
        (("s", "k", 0), "cost must be a positive whole number"),
        (("s", "k", True), "cost must be a positive whole number"),
    ],
)
def test_bad_arguments_are_named(arguments: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_key(*arguments)


def test_acheck_key_decides_on_the_asyncio_client() -> None:
    rule("async-jobs", "async-jobs", 2, algorithm="fixed_window")

    async def three() -> list[bool]:
        return [(await acheck_key("async-jobs", "tenant:9")).allowed for _ in range(3)]

    assert run(three) == [True, True, False]


# -- acquire --------------------------------------------------------------------------------


def test_acquire_sleeps_until_the_retry_time_instead_of_polling(store_calls: Any) -> None:
    rule("second", "partner-api", 2, unit="second", algorithm="fixed_window")
    assert acquire("partner-api", "partner:acme").allowed
    assert acquire("partner-api", "partner:acme").allowed
    calls = store_calls.decisions
    decision = acquire("partner-api", "partner:acme", timeout=3)
    assert decision.allowed
    # One rejection, one sleep until the next window, one admission: not a busy loop.
    assert store_calls.decisions - calls == 2


def test_acquire_gives_up_when_the_retry_time_is_past_the_timeout() -> None:
    rule("hourly", "hourly", 1, unit="hour", algorithm="fixed_window")
    assert acquire("hourly", "job:1").allowed
    started = time.monotonic()
    decision = acquire("hourly", "job:1", timeout=2)
    assert not decision.allowed and decision.retry_after > 2
    assert time.monotonic() - started < 1  # it knew it could not wait that long


def test_aacquire_waits_on_the_event_loop() -> None:
    rule("second", "async-partner", 1, unit="second", algorithm="fixed_window")

    async def two() -> list[bool]:
        return [(await aacquire("async-partner", "partner:acme", timeout=3)).allowed for _ in "ab"]

    assert run(two) == [True, True]


@pytest.mark.django_db(transaction=True)
def test_processes_acquiring_share_one_limit(redis_server: Any, tmp_path: Any) -> None:
    """Four processes, 4 acquisitions each, on "5 per second": every one is admitted, and no
    window of the server's clock admitted more than 5."""
    rule("shared", "shared-worker", 5, unit="second", algorithm="fixed_window")
    with redis.Redis.from_url(redis_server.url) as client:
        client.config_resetstat()  # decisions are counted below, from this test's only
    database = dict(connection.settings_dict)  # the test database, which holds the rule
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(4)
    out = context.Queue()
    workers = [
        context.Process(target=acquire_worker, args=(redis_server.url, database, barrier, 4, out))
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    results = [out.get(timeout=30) for _ in range(16)]
    for worker in workers:
        worker.join(timeout=10)
    assert all(allowed for allowed, _ in results)
    per_window = Counter(reset_at for _, reset_at in results)
    assert max(per_window.values()) <= 5 and sum(per_window.values()) == 16
    assert len(per_window) >= 4  # 16 at 5 a window take at least 4 windows
    with redis.Redis.from_url(redis_server.url) as client:
        # Decided in the shared Redis (its 1-second windows may have expired by now).
        calls = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert calls >= 16
