"""Counting only some outcomes (``count_statuses``): a request is counted before its view, as
any other, and what it took is given back once its response has a status the rule does not
count; an exception counts as the status Django answers it with (500)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from django.contrib import admin
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.handlers.asgi import ASGIHandler
from django.db import connection, models
from django.http import Http404, HttpRequest, HttpResponse
from django.test import Client, RequestFactory
from django.urls import path
from django.utils.html import escape

from django_throttle import check, check_key, throttle
from django_throttle.management.rulefiles import RuleFileError, export_rules, import_rules, load
from django_throttle.models import Rule
from django_throttle.rules import get_rules, rule_cache
from tests.engine_helpers import ALGORITHMS
from tests.helpers import rule, run
from tests.test_admin import ADD, form_data
from tests.traffic import asgi_get, database_kept_open

ADDRESS = "203.0.113.9"


# -- views: each answers the status its path names ------------------------------------------


def answer(request: HttpRequest, status: int) -> HttpResponse:
    if request.GET.get("slow"):
        time.sleep(0.3)  # still in the view while the parallel attempts arrive
    return HttpResponse(str(status), status=status)


async def aanswer(request: HttpRequest, status: int) -> HttpResponse:
    return HttpResponse(str(status), status=status)


def raising(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("the view failed")


# A request held in its view until the test lets it go (``?hold=1``): its share stands meanwhile.
INSIDE, RELEASE = threading.Event(), threading.Event()


def held(request: HttpRequest, status: int) -> HttpResponse:
    if request.GET.get("hold"):
        INSIDE.set()
        assert RELEASE.wait(30)
    return HttpResponse(str(status), status=status)


held_coded = throttle(
    "held-coded", rate="1/s", algorithm="token_bucket", burst=1, count_statuses="401"
)(held)


@throttle("coded", rate="2/m", count_statuses="401")
def coded(request: HttpRequest, status: int) -> HttpResponse:
    return HttpResponse(str(status), status=status)


@throttle("coded-async", rate="2/m", count_statuses="401")
async def coded_async(request: HttpRequest, status: int) -> HttpResponse:
    return HttpResponse(str(status), status=status)


@throttle("coded-failing", rate="2/m", count_statuses="5xx")
def coded_failing(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("the view failed")


@throttle("coded-forbidden", rate="2/m", count_statuses="4xx")
def coded_forbidden(request: HttpRequest, what: str) -> HttpResponse:
    raise Http404("no such thing") if what == "missing" else PermissionDenied("no")


urlpatterns = [
    path("admin/", admin.site.urls),
    path("attempt/<int:status>/", answer, name="attempt"),
    path("held/<int:status>/", held, name="held"),
    path("held-coded/<int:status>/", held_coded, name="held-coded-page"),
    path("async-attempt/<int:status>/", aanswer, name="async-attempt"),
    path("raising/", raising, name="raising"),
    path("coded/<int:status>/", coded, name="coded-page"),
    path("coded-async/<int:status>/", coded_async, name="coded-async-page"),
    path("coded-failing/", coded_failing, name="coded-failing-page"),
    path("coded-forbidden/<str:what>/", coded_forbidden, name="coded-forbidden-page"),
]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


def statuses(paths: list[str], **extra: Any) -> list[int]:
    client = Client(REMOTE_ADDR=ADDRESS, raise_request_exception=False)
    return [client.get(p, **extra).status_code for p in paths]


# -- through the middleware, for every algorithm ------------------------------------------


@pytest.mark.usefixtures("throttle_middleware")
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_only_the_counted_status_uses_up_the_limit(algorithm: str) -> None:
    rule("attempts", "attempt", 2, count_statuses="401", algorithm=algorithm)
    assert statuses(["/attempt/200/"] * 6) == [200] * 6  # each counted, then given back
    assert statuses(["/attempt/401/", "/attempt/200/", "/attempt/401/"]) == [401, 200, 401]
    # Two 401s: the limit is used up, whatever the next response would be.
    assert statuses(["/attempt/401/", "/attempt/200/"]) == [429, 429]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("throttle_middleware")
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_parallel_attempts_cannot_all_pass(algorithm: str) -> None:
    rule("attempts", "attempt", 1, count_statuses="401", algorithm=algorithm)
    get_rules()  # loaded before the threads start
    barrier = threading.Barrier(8)
    answers: list[int] = []

    def attempt() -> None:
        barrier.wait()
        try:
            answers.extend(statuses(["/attempt/401/"], data={"slow": "1"}))
        finally:
            connection.close()  # this thread's connection to the test database

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Counted before the view: one reached it, the others were rejected while it ran.
    assert sorted(answers) == [401] + [429] * 7


def wait_for_room(path: str) -> None:
    """Until the bucket has room for one more (the first request's own interval has ended)."""
    scope = "held-coded" if "coded" in path else "held"
    request = RequestFactory().get(path, REMOTE_ADDR=ADDRESS)
    while not check(request, scope, dry_run=True).allowed:
        time.sleep(0.01)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("algorithm", "path"),
    [
        ("token_bucket", "/held/"),
        ("leaky_bucket", "/held/"),
        ("token_bucket", "/held-coded/"),  # the decorator's code default, no middleware
    ],
)
def test_a_slow_uncounted_request_gives_back_only_what_it_still_holds(
    algorithm: str, path: str, settings: Any
) -> None:
    """Issue 30's case, "1 per second, burst 1, count 401": A is admitted and stays in its
    view past its own interval; B (a 401) is admitted once A's interval has ended; A's 200
    then gives back what A still holds, nothing, so C (a 401 right after) is rejected: one
    401 per second, not two. Giving back A's whole interval emptied the bucket (B's share
    lost) and let C in."""
    if path == "/held/":
        auth = settings.MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware")
        settings.MIDDLEWARE = [
            *settings.MIDDLEWARE[: auth + 1],
            "django_throttle.middleware.ThrottleMiddleware",
            *settings.MIDDLEWARE[auth + 1 :],
        ]
        rule("held", "held", 1, unit="second", algorithm=algorithm, burst=1, count_statuses="401")
    INSIDE.clear()
    RELEASE.clear()
    answers: list[int] = []

    def first() -> None:
        try:
            answers.extend(statuses([f"{path}200/"], data={"hold": "1"}))
        finally:
            connection.close()  # this thread's connection to the test database

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert INSIDE.wait(30)
        wait_for_room(f"{path}401/")
        assert statuses([f"{path}401/"]) == [401]  # B
    finally:
        RELEASE.set()
        thread.join()
    assert answers == [200]  # A, given back
    assert statuses([f"{path}401/"]) == [429]  # C: B's share stands


@pytest.mark.usefixtures("throttle_middleware")
def test_a_class_of_statuses() -> None:
    rule("client-errors", "attempt", 3, count_statuses="4xx", algorithm="fixed_window")
    paths = ["/attempt/200/", "/attempt/302/", "/attempt/500/", "/attempt/204/"] * 2
    assert statuses(paths) == [200, 302, 500, 204] * 2
    assert statuses(["/attempt/403/", "/attempt/404/", "/attempt/429/"]) == [403, 404, 429]
    assert statuses(["/attempt/200/"]) == [429]


@pytest.mark.usefixtures("throttle_middleware")
@pytest.mark.parametrize(("counted", "expected"), [("5xx", [500, 500, 429]), ("401", [500] * 3)])
def test_a_view_that_raises_counts_as_500(counted: str, expected: list[int]) -> None:
    rule("failures", "raising", 2, count_statuses=counted, algorithm="sliding_window_log")
    assert statuses(["/raising/"] * 3) == expected


@pytest.mark.usefixtures("throttle_middleware")
def test_an_exception_that_reaches_the_middleware_counts_as_500(settings: Any) -> None:
    settings.DEBUG_PROPAGATE_EXCEPTIONS = True  # Django re-raises it instead of answering 500
    rule("failures", "raising", 1, count_statuses="500", algorithm="fixed_window")
    rule("others", "raising", 1, count_statuses="401", algorithm="fixed_window")
    client = Client(REMOTE_ADDR=ADDRESS)
    with pytest.raises(RuntimeError):
        client.get("/raising/")
    checked = check(client_request(), "raising", dry_run=True)
    remaining = {r.rule.name: r.remaining for r in checked.results}
    assert remaining == {"failures": 0, "others": 1}


def client_request() -> Any:
    from django.test import RequestFactory

    return RequestFactory().get("/raising/", REMOTE_ADDR=ADDRESS)


@pytest.mark.usefixtures("throttle_middleware")
def test_an_unrestricted_rule_still_counts_every_request() -> None:
    rule("attempts", "attempt", 2, algorithm="fixed_window")
    assert statuses(["/attempt/200/"] * 3) == [200, 200, 429]


# -- the decorator's code default ------------------------------------------------------------


@pytest.mark.parametrize("middleware", [False, True])
def test_the_decorators_code_default(middleware: bool, settings: Any) -> None:
    if middleware:
        auth = settings.MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware")
        settings.MIDDLEWARE = [
            *settings.MIDDLEWARE[: auth + 1],
            "django_throttle.middleware.ThrottleMiddleware",
            *settings.MIDDLEWARE[auth + 1 :],
        ]
    assert statuses(["/coded/200/"] * 4) == [200] * 4
    assert statuses(["/coded/401/"] * 3) == [401, 401, 429]


def test_the_decorator_counts_an_exception_as_django_answers_it() -> None:
    # No middleware: the decorator sees the exception itself.
    assert statuses(["/coded-failing/"] * 3) == [500, 500, 429]
    assert statuses(["/coded-forbidden/missing/", "/coded-forbidden/denied/"]) == [404, 403]
    assert statuses(["/coded-forbidden/missing/"]) == [429]


def test_an_admin_rule_replaces_the_code_defaults_statuses() -> None:
    rule("coded", "coded", 2, algorithm="fixed_window")  # counts every request
    assert statuses(["/coded/200/"] * 3) == [200, 200, 429]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": "5/m", "count_statuses": "4xz"}, "neither an HTTP status"),
        ({"rate": "5/m", "count_statuses": "600"}, "statuses run from 100 to 599"),
        ({"rate": "5/m", "count_statuses": 401}, "must be text"),
        ({"count_statuses": "401"}, "give rate= too"),
        ({"rate": "5/m", "algorithm": "concurrency", "count_statuses": "401"}, "concurrency"),
    ],
)
def test_the_decorator_refuses_statuses_it_cannot_use(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        throttle("refused", **kwargs)


# -- async (ASGI) ----------------------------------------------------------------------------


def asgi_statuses(paths: list[str]) -> list[int | None]:
    async def body() -> list[int | None]:
        with database_kept_open():
            app = ASGIHandler()
            return [(await asgi_get(app, p, client_ip=ADDRESS))[0] for p in paths]

    return list(run(body))


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("throttle_middleware")
@pytest.mark.parametrize("algorithm", ["sliding_window_counter", "token_bucket"])
def test_the_async_middleware_gives_back_uncounted_statuses(algorithm: str) -> None:
    rule("attempts", "async-attempt", 2, count_statuses="401", algorithm=algorithm)
    assert asgi_statuses(["/async-attempt/200/"] * 5) == [200] * 5
    assert asgi_statuses(["/async-attempt/401/"] * 2 + ["/async-attempt/200/"]) == [
        401,
        401,
        429,
    ]


@pytest.mark.django_db(transaction=True)
def test_the_async_decorator_gives_back_uncounted_statuses() -> None:
    assert asgi_statuses(["/coded-async/200/"] * 4) == [200] * 4
    assert asgi_statuses(["/coded-async/401/"] * 3) == [401, 401, 429]


# -- the block cache -------------------------------------------------------------------------


@pytest.mark.usefixtures("throttle_middleware")
def test_a_success_that_filled_the_limit_lets_every_block_cache_forget_the_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_throttle.engine import finish
    from django_throttle.rules import RuleCache

    announced: list[int] = []
    monkeypatch.setattr(RuleCache, "announce_blocks", lambda cache: announced.append(1))
    rule("attempts", "attempt", 1, count_statuses="401", algorithm="fixed_window")
    first, second = client_request(), client_request()
    assert check(first, "attempt").allowed  # took the only one: remaining 0
    assert not check(second, "attempt").allowed  # remembered by the block cache
    blocked = rule_cache().current().blocked  # type: ignore[union-attr]
    assert blocked
    finish(first, HttpResponse(status=200))  # not a 401: given back
    assert not blocked and announced == [1]
    assert check(client_request(), "attempt").allowed


@pytest.mark.usefixtures("throttle_middleware")
def test_a_success_with_room_left_announces_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_throttle.rules import RuleCache

    announced: list[int] = []
    monkeypatch.setattr(RuleCache, "announce_blocks", lambda cache: announced.append(1))
    rule("attempts", "attempt", 5, count_statuses="401", algorithm="fixed_window")
    assert statuses(["/attempt/200/"] * 10) == [200] * 10
    assert announced == []


# -- validation and the admin ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("4xz", "'4xz' is neither a status nor a class of statuses"),
        ("abc", "'abc' is neither a status nor a class of statuses"),
        ("99", "99 is not an HTTP status: statuses run from 100 to 599."),
        ("401,600", "600 is not an HTTP status: statuses run from 100 to 599."),
    ],
)
def test_the_admin_form_says_what_is_wrong(admin_client: Any, text: str, message: str) -> None:
    response = admin_client.post(ADD, form_data(count_statuses=text))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert any(message in error for error in errors["count_statuses"]), errors
    assert escape(message) in response.content.decode()
    assert not Rule.objects.exists()


def test_a_concurrency_rule_refuses_statuses(admin_client: Any) -> None:
    response = admin_client.post(
        ADD, form_data(algorithm="concurrency", count_statuses="401", unit="minute")
    )
    errors = response.context["adminform"].form.errors
    assert "counts every request in flight" in errors["count_statuses"][0]


def test_the_admin_saves_the_statuses_as_written_and_says_them(admin_client: Any) -> None:
    response = admin_client.post(ADD, form_data(count_statuses=" 401, 403,4XX,401"))
    assert response.status_code == 302
    saved = Rule.objects.get()
    assert saved.count_statuses == "401,403,4xx"
    assert saved.explanation.startswith(
        "at most 5 requests per minute per client IP, counting only responses 401, 403, 4xx"
    )
    page = admin_client.get(f"/admin/django_throttle/rule/{saved.pk}/change/")
    assert "counting only responses 401, 403, 4xx" in page.content.decode()


def test_every_write_validates_the_statuses() -> None:
    with pytest.raises(ValidationError, match="neither a status"):
        Rule.objects.bulk_create([Rule(name="bad", scope="*", limit=1, count_statuses="4xz")])
    rule("ok", "*", 1)
    with pytest.raises(ValidationError, match="Rule 'ok'.*600 is not an HTTP status"):
        Rule.objects.update(count_statuses="600")


def test_a_row_written_around_validation_is_skipped(caplog: Any) -> None:
    kept = rule("kept", "/kept/", 1)
    broken = rule("broken", "/broken/", 1)
    models.QuerySet(model=Rule).filter(pk=broken.pk).update(count_statuses="4xz")
    assert [r.name for r in get_rules().rules] == [kept.name]
    assert "rule 'broken' cannot be enforced" in caplog.text


def test_the_compiled_rule_holds_every_counted_status() -> None:
    rule("attempts", "attempt", 2, count_statuses="401,5xx")
    rule("all", "/all/", 2)
    compiled = {r.name: r.count_statuses for r in get_rules().rules}
    assert compiled == {"attempts": frozenset({401, *range(500, 600)}), "all": None}


# -- rule files ------------------------------------------------------------------------------


def test_export_and_import_keep_the_statuses() -> None:
    rule("attempts", "attempt", 2, count_statuses="401,5xx")
    exported = export_rules()
    assert exported["rules"][0]["count_statuses"] == "401,5xx"
    text = json.dumps(exported)
    Rule.objects.all().delete()
    plan = import_rules(load(text, "json"), prune=False, dry_run=False)
    assert plan.create == ["attempts"]
    assert Rule.objects.get().count_statuses == "401,5xx"
    # Imported again, nothing changed; a new value is a change of that field.
    assert import_rules(load(text, "json"), prune=False, dry_run=True).unchanged == ["attempts"]
    exported["rules"][0]["count_statuses"] = "4xx"
    plan = import_rules(load(json.dumps(exported), "json"), prune=False, dry_run=True)
    assert plan.change == [("attempts", ["count_statuses"])]


def test_a_hand_written_file_may_give_numbers_and_lists() -> None:
    pytest.importorskip("yaml")
    text = """
rules:
  - name: one
    scope: login
    limit: 5
    count_statuses: 401
  - name: some
    scope: api
    limit: 5
    count_statuses: [429, 5xx]
"""
    import_rules(load(text, "yaml"), prune=False, dry_run=False)
    assert dict(Rule.objects.values_list("name", "count_statuses")) == {
        "one": "401",
        "some": "429,5xx",
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('"4xz"', "count_statuses: '4xz' is neither a status"),
        ('"600"', "count_statuses: 600 is not an HTTP status"),
        ("true", "count_statuses: text such as"),
        ('{"a": 1}', "count_statuses: text such as"),
    ],
)
def test_a_file_with_bad_statuses_is_refused(value: str, message: str) -> None:
    entry = '{"name": "bad", "scope": "login", "limit": 5, "count_statuses": ' + value + "}"
    text = '{"rules": [' + entry + "]}"
    with pytest.raises(RuleFileError, match=message):
        import_rules(load(text, "json"), prune=False, dry_run=False)
    assert not Rule.objects.exists()


def test_a_file_cannot_give_a_concurrency_rule_statuses() -> None:
    text = json.dumps(
        {
            "rules": [
                {
                    "name": "slots",
                    "scope": "api",
                    "limit": 5,
                    "algorithm": "concurrency",
                    "count_statuses": "5xx",
                }
            ]
        }
    )
    with pytest.raises(RuleFileError, match="counts every request in flight"):
        import_rules(load(text, "json"), prune=False, dry_run=False)


# -- blocks start from counted outcomes only -----------------------------------------------------


def parallel(path: str, times: int) -> list[int]:
    """The statuses of ``times`` requests sent at once, each slow in its view (0.3 s), so every
    one arrives while the others still hold their share."""
    get_rules()  # loaded before the threads start
    barrier = threading.Barrier(times)
    answers: list[int] = []

    def attempt() -> None:
        barrier.wait()
        try:
            answers.extend(statuses([path], data={"slow": "1"}))
        finally:
            connection.close()  # this thread's connection to the test database

    threads = [threading.Thread(target=attempt) for _ in range(times)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(answers)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("throttle_middleware")
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_rejection_by_shares_in_flight_starts_no_block(algorithm: str) -> None:
    """ "3 per minute, count 5xx, block 600": four requests at once, all answered 200. The
    fourth is rejected while the first three are in their views (their outcome unknown), but
    nothing was counted: no block, and the next request is served."""
    rule("errors", "attempt", 3, count_statuses="5xx", block_seconds=600, algorithm=algorithm)
    assert parallel("/attempt/200/", 4) == [200, 200, 200, 429]
    assert statuses(["/attempt/200/"]) == [200]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("throttle_middleware")
def test_parallel_right_passwords_never_lock_the_address_out() -> None:
    """The lockout rule of docs/usage.md (5 per 15 minutes, count 401, block 3600): six right
    passwords at once (200s) lock nobody out."""
    rule("login-failures", "attempt", 5, per=15, count_statuses="401", block_seconds=3600)
    assert parallel("/attempt/200/", 6) == [200] * 5 + [429]
    assert statuses(["/attempt/401/", "/attempt/200/"]) == [401, 200]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("throttle_middleware")
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_counted_failures_that_fill_the_limit_start_the_block(algorithm: str) -> None:
    """Twenty wrong passwords at once: exactly five reach the view; their five 401s fill the
    limit, which starts the hour's block, whatever the next request would answer."""
    rule(
        "login-failures",
        "attempt",
        5,
        per=15,
        count_statuses="401",
        block_seconds=3600,
        algorithm=algorithm,
    )
    assert parallel("/attempt/401/", 20) == [401] * 5 + [429] * 15
    [result] = check(client_request_to("/attempt/200/"), "attempt", dry_run=True).results
    assert result.blocked and 3590 < result.retry_after <= 3600
    assert statuses(["/attempt/200/"]) == [429]


@pytest.mark.usefixtures("throttle_middleware")
def test_the_block_starts_with_the_failure_that_fills_the_limit() -> None:
    """One at a time, with right passwords between: only counted failures go towards it."""
    rule("login-failures", "attempt", 3, count_statuses="401", block_seconds=3600)
    assert statuses(["/attempt/401/", "/attempt/200/", "/attempt/401/", "/attempt/200/"]) == [
        401,
        200,
        401,
        200,
    ]
    [result] = check(client_request_to("/attempt/200/"), "attempt", dry_run=True).results
    assert not result.blocked
    assert statuses(["/attempt/401/", "/attempt/200/"]) == [401, 429]
    [result] = check(client_request_to("/attempt/200/"), "attempt", dry_run=True).results
    assert result.blocked and 3590 < result.retry_after <= 3600


def test_check_key_counts_every_call_and_blocks_when_it_rejects() -> None:
    """check_key() has no response to count: every call counts, and its rejection blocks."""
    rule("login-failures", "attempt", 2, count_statuses="401", block_seconds=600)
    assert [check_key("attempt", f"ip:{ADDRESS}").allowed for _ in range(3)] == [
        True,
        True,
        False,
    ]
    [result] = check_key("attempt", f"ip:{ADDRESS}", dry_run=True).results
    assert result.blocked and 590 < result.retry_after <= 600


def client_request_to(path: str) -> Any:
    from django.test import RequestFactory

    return RequestFactory().get(path, REMOTE_ADDR=ADDRESS)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("throttle_middleware")
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_only_settled_counted_outcomes_go_towards_the_block(algorithm: str) -> None:
    """Limit 5, count 401, block 3600: three 401s, then a right password held in its view
    (its share taken, its outcome unknown), then a fourth 401, which fills the limit with that
    share but counts the fourth failure only: no block. The right password's 200 gives its
    share back; a fifth 401 fills the limit with failures: the block starts."""
    rule(
        "login-failures",
        "held",
        5,
        per=15,
        count_statuses="401",
        block_seconds=3600,
        algorithm=algorithm,
    )

    def blocked() -> bool:
        [result] = check(client_request_to("/held/200/"), "held", dry_run=True).results
        return result.blocked

    assert statuses(["/held/401/"] * 3) == [401] * 3
    INSIDE.clear()
    RELEASE.clear()
    answers: list[int] = []

    def right_password() -> None:
        try:
            answers.extend(statuses(["/held/200/"], data={"hold": "1"}))
        finally:
            connection.close()  # this thread's connection to the test database

    thread = threading.Thread(target=right_password)
    thread.start()
    try:
        assert INSIDE.wait(30)
        assert statuses(["/held/401/"]) == [401]  # the fourth failure: the limit is full
        assert not blocked()
        assert statuses(["/held/401/"]) == [429]  # rejected by the share in flight
        assert not blocked()
    finally:
        RELEASE.set()
        thread.join()
    assert answers == [200]
    assert statuses(["/held/401/"]) == [401]  # the fifth failure
    assert blocked()
    assert statuses(["/held/200/"]) == [429]
