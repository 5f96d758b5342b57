"""Attempts counted before they happen: ``refund()`` / ``refund_key()`` give back what a check
took (atomically, for every algorithm, never below empty), and the login-lockout recipe of
docs/usage.md holds against parallel attempts."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.auth.signals import user_login_failed
from django.db import connection
from django.test import Client, RequestFactory

from django_throttle import check, check_key, refund, refund_key
from django_throttle.models import Rejection
from django_throttle.rejection_log import flush
from tests.engine_helpers import ALGORITHMS
from tests.helpers import rule

pytestmark = pytest.mark.django_db

ADDRESS = "203.0.113.7"


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest, settings: Any) -> str:
    if request.param == "memory":
        settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "BACKEND": "memory"}
    return str(request.param)


def attempt() -> Any:
    return RequestFactory().post("/", REMOTE_ADDR=ADDRESS)


def remaining(scope: str) -> int:
    decision = check(attempt(), scope, dry_run=True)
    assert decision.remaining is not None
    return decision.remaining


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_refund_gives_back_what_the_check_took(backend: str, algorithm: str) -> None:
    rule("attempts", "attempts", 3, unit="hour", algorithm=algorithm)
    first = attempt()
    assert check(first, "attempts").allowed
    before = remaining("attempts")
    second = attempt()
    assert check(second, "attempts").remaining == before - 1
    assert refund(second, "attempts") == 1
    assert remaining("attempts") == before
    # Given back once: a second refund of the same request gives nothing more.
    assert refund(second, "attempts") == 0
    assert remaining("attempts") == before


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_refund_key_never_goes_below_empty(backend: str, algorithm: str) -> None:
    rule("partner", "partner-api", 3, unit="hour", algorithm=algorithm)
    assert check_key("partner-api", "partner:acme").remaining == 2
    assert refund_key("partner-api", "partner:acme") == 1
    for _ in range(3):
        refund_key("partner-api", "partner:acme")
    decision = check_key("partner-api", "partner:acme", dry_run=True)
    assert decision.remaining == 3
    assert [check_key("partner-api", "partner:acme").allowed for _ in range(4)] == [
        True,
        True,
        True,
        False,
    ]


def test_a_rejected_check_took_nothing_to_give_back(backend: str) -> None:
    rule("attempts", "attempts", 1, unit="hour", algorithm="fixed_window")
    assert check(attempt(), "attempts").allowed
    rejected = attempt()
    assert not check(rejected, "attempts").allowed
    assert refund(rejected, "attempts") == 0
    assert remaining("attempts") == 0


# -- the lockout recipe: accounts/views.py of docs/usage.md --------------------------------


class Authentications:
    """Attempts that reached authenticate() and failed (Django's user_login_failed signal)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failed = 0

    def __call__(self, **_: Any) -> None:
        with self.lock:
            self.failed += 1


@pytest.fixture
def lockout(settings: Any) -> Iterator[Authentications]:
    """The recipe's view at /login/, its template's app installed, a user who may log in."""
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "tests.recipes.login_site.accounts"]
    settings.ROOT_URLCONF = "tests.recipes.urls"
    User.objects.create_user("ann", password="right")
    failed = Authentications()
    user_login_failed.connect(failed, weak=False)
    yield failed
    user_login_failed.disconnect(failed)


def post_login(password: str) -> int:
    client = Client(REMOTE_ADDR=ADDRESS)
    return client.post("/login/", {"username": "ann", "password": password}).status_code


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_twenty_parallel_wrong_passwords_let_exactly_five_reach_authenticate(
    lockout: Authentications, algorithm: str
) -> None:
    rule("failed-login", "failed-login", 5, per=15, unit="minute", algorithm=algorithm)
    check(attempt(), "failed-login", dry_run=True)  # rules loaded before the threads start
    barrier = threading.Barrier(20)
    statuses: list[int] = []

    def guess() -> None:
        barrier.wait()
        try:
            statuses.append(post_login("wrong"))
        finally:
            connection.close()  # this thread's connection to the test database

    threads = [threading.Thread(target=guess) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert lockout.failed == 5
    assert sorted(statuses) == [401] * 5 + [429] * 15
    # The lockout's rejections are on the dashboard.
    flush()
    counted = Rejection.objects.filter(rule="failed-login").values_list("count", flat=True)
    assert sum(counted) == 15


def test_the_right_password_does_not_use_up_an_attempt(lockout: Authentications) -> None:
    rule("failed-login", "failed-login", 5, per=15, unit="minute", algorithm="sliding_window_log")
    assert [post_login("wrong") for _ in range(4)] == [401] * 4
    assert post_login("right") == 302  # counted, then given back
    assert post_login("wrong") == 401  # the fifth attempt
    assert post_login("right") == 429  # locked out, whatever the password
    assert lockout.failed == 5


def test_a_refund_gives_back_at_most_what_was_taken(backend: str) -> None:
    rule("exports", "exports", 10, unit="hour", algorithm="fixed_window")
    request = attempt()
    assert check(request, "exports", cost=5).remaining == 5
    assert refund(request, "exports", cost=2) == 1  # 2 of the 5
    assert remaining("exports") == 7
    assert refund(request, "exports", cost=9) == 1  # the 3 left, not 9
    assert remaining("exports") == 10
    assert refund(request, "exports") == 0
