"""Costs settled after the response (Rule.cost_header, settle()): a request takes its estimate
before the view, and the difference from its actual cost is charged or given back once when
the response ends (a streaming one: when closed), under every rule that counted it; a view that
raises settles nothing. Through the middleware and the decorator, against a real Redis."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.test import AsyncClient, Client
from django.urls import path

from django_throttle import asettle, check_key, settle, throttle
from django_throttle.models import Rule
from django_throttle.rules import get_rules
from tests.engine_helpers import ALGORITHMS
from tests.helpers import room_in_the_minute, rule, run
from tests.served import serving

ADDRESS = "203.0.113.77"
CHARGED = [a for a in ALGORITHMS if a != "concurrency"]
STREAMED: list[str] = []  # what the streaming view sent, in order


def reported(request: HttpRequest, tokens: int) -> HttpResponse:
    """Reports its cost in a header (Rule.cost_header)."""
    response = HttpResponse("done")
    response["X-Tokens"] = str(tokens)
    return response


def settled(request: HttpRequest, tokens: int) -> HttpResponse:
    """Reports its cost with settle()."""
    settle(request, tokens)
    return HttpResponse("done")


async def asettled(request: HttpRequest, tokens: int) -> HttpResponse:
    await asettle(request, tokens)
    return HttpResponse("done")


def streamed(request: HttpRequest, tokens: int) -> StreamingHttpResponse:
    """A completion streamed a token at a time, settled once the stream ends."""

    def completion() -> Iterator[str]:
        for n in range(tokens):
            STREAMED.append(f"token {n}")
            yield "t "
        settle(request, tokens)

    return StreamingHttpResponse(completion())


def headed(request: HttpRequest) -> HttpResponse:
    """Reports in X-Tokens whatever the test asks for."""
    response = HttpResponse("done")
    response["X-Tokens"] = request.GET["v"]
    return response


def raising(request: HttpRequest, tokens: int) -> HttpResponse:
    settle(request, tokens)
    raise RuntimeError("the model failed")


@throttle("llm-coded", rate="1000/m", algorithm="fixed_window")
def coded(request: HttpRequest, tokens: int) -> HttpResponse:
    settle(request, tokens)
    return HttpResponse("done")


urlpatterns = [
    path("llm/reported/<int:tokens>/", reported),
    path("llm/settled/<int:tokens>/", settled),
    path("llm/asettled/<int:tokens>/", asettled),
    path("llm/streamed/<int:tokens>/", streamed),
    path("llm/raising/<int:tokens>/", raising),
    path("llm/headed/", headed),
    path("coded/<int:tokens>/", coded),
]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


def statuses(paths: list[str]) -> list[int]:
    client = Client(REMOTE_ADDR=ADDRESS, raise_request_exception=False)
    return [client.get(p).status_code for p in paths]


def used(name: str, address: str = ADDRESS) -> int:
    """How much of rule ``name`` the client has used, as the store says (consuming nothing)."""
    decision = check_key("/llm/", f"ip:{address}", dry_run=True)
    (result,) = [r for r in decision.results if r.rule.name == name]
    return result.limit - result.remaining


@pytest.mark.usefixtures("throttle_middleware")
@pytest.mark.parametrize("algorithm", CHARGED)
def test_a_response_reporting_100_of_1000_a_minute_is_admitted_ten_times(algorithm: str) -> None:
    # A bucket refills as time passes (1,000 a minute: one unit in 60 ms, which a busy machine
    # may take for 11 requests): an hour's bucket holds still. A window must not end midway.
    unit = "hour" if algorithm in ("token_bucket", "leaky_bucket") else "minute"
    if algorithm in ("fixed_window", "sliding_window_counter"):
        room_in_the_minute()
    rule("tokens", "/llm/", 1000, unit=unit, algorithm=algorithm, cost_header="X-Tokens")
    assert statuses(["/llm/reported/100/"] * 11) == [200] * 10 + [429]


@pytest.mark.usefixtures("throttle_middleware")
def test_settle_from_the_view_under_every_rule_or_one() -> None:
    rule("tokens-minute", "/llm/", 1000, unit="minute", algorithm="sliding_window_log")
    rule("tokens-day", "/llm/", 100_000, unit="day", algorithm="fixed_window")
    assert statuses(["/llm/settled/300/"] * 2) == [200, 200]
    assert (used("tokens-minute"), used("tokens-day")) == (600, 600)


@pytest.mark.usefixtures("throttle_middleware")
def test_a_smaller_actual_cost_gives_back_and_an_equal_one_costs_no_call(
    store_calls: Any,
) -> None:
    rule("tokens", "/llm/", 1000, unit="minute", algorithm="sliding_window_log")
    statuses(["/llm/settled/0/"])
    assert used("tokens") == 0
    before = (store_calls.decisions, store_calls.refunds)
    statuses(["/llm/settled/1/"])  # the estimate was right: the decision only
    assert (store_calls.decisions, store_calls.refunds) == (before[0] + 1, before[1])
    statuses(["/llm/settled/3/"])  # one call more, for the charge
    assert (store_calls.decisions, store_calls.refunds) == (before[0] + 2, before[1] + 1)
    assert used("tokens") == 1 + 3


@pytest.mark.usefixtures("throttle_middleware")
@pytest.mark.parametrize("algorithm", ["fixed_window", "token_bucket"])
def test_a_charge_past_the_limit_makes_later_requests_wait_until_it_drains(
    algorithm: str,
) -> None:
    if algorithm == "fixed_window":
        room_in_the_minute()
    rule("tokens", "/llm/", 100, unit="minute", algorithm=algorithm)
    client = Client(REMOTE_ADDR=ADDRESS)
    assert client.get("/llm/settled/250/").status_code == 200  # the work is done
    refused = client.get("/llm/settled/1/")
    assert refused.status_code == 429
    seconds = int(refused["Retry-After"])
    if algorithm == "token_bucket":
        assert 89 <= seconds <= 91  # 150 units past the bucket at 100 a minute
    else:
        assert 1 <= seconds <= 60  # the window's end


@pytest.mark.usefixtures("throttle_middleware")
def test_a_streamed_response_settles_once_when_closed() -> None:
    rule("tokens", "/llm/", 1000, unit="hour", algorithm="sliding_window_log")
    client = Client(REMOTE_ADDR=ADDRESS)
    response = client.get("/llm/streamed/40/")
    assert used("tokens") == 1  # the estimate, until the stream is read and closed
    assert b"".join(response.streaming_content) == b"t " * 40
    response.close()
    assert used("tokens") == 40
    response.close()  # closed again: settled once
    assert used("tokens") == 40


GUNICORN = ["gunicorn", "tests.served:wsgi", "--bind", "127.0.0.1:{port}", "--log-level", "warning"]
UVICORN = ["uvicorn", "tests.served:asgi", "--port", "{port}", "--log-level", "warning"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", [GUNICORN, UVICORN], ids=["gunicorn", "uvicorn"])
def test_a_stream_settles_once_when_a_real_server_closes_it(server: list[str]) -> None:
    rule("tokens", "/llm/", 1000, unit="hour", algorithm="sliding_window_log")
    with serving(server, dict(connection.settings_dict)) as port:
        for _ in range(2):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/llm/stream/25/") as answer:
                assert answer.read() == b"t " * 25
    # Closed by the server after the last chunk; settled once each, by the time it stopped.
    assert used("tokens", "127.0.0.1") == 50


@pytest.mark.usefixtures("throttle_middleware")
def test_a_view_that_raises_leaves_the_estimate() -> None:
    rule("tokens", "/llm/", 1000, unit="hour", algorithm="sliding_window_log")
    assert statuses(["/llm/raising/500/"]) == [500]
    assert used("tokens") == 1


@pytest.mark.usefixtures("throttle_middleware")
def test_a_missing_or_invalid_header_leaves_the_estimate() -> None:
    rule(
        "tokens", "/llm/", 1000, unit="hour", algorithm="sliding_window_log", cost_header="X-Tokens"
    )
    client = Client(REMOTE_ADDR=ADDRESS)
    for bad in ("", "ten", "-5", "1e3", "99999999999", "\u0661\u0662"):
        assert client.get("/llm/headed/", {"v": bad}).status_code == 200
    assert used("tokens") == 6
    assert client.get("/llm/headed/", {"v": " 94 "}).status_code == 200
    assert used("tokens") == 6 + 94


@pytest.mark.usefixtures("throttle_middleware")
def test_asettle_in_an_async_view() -> None:
    rule("tokens", "/llm/", 1000, unit="minute", algorithm="sliding_window_log")

    async def body() -> list[int]:
        client = AsyncClient()  # from 127.0.0.1, as ASGI test requests come
        return [(await client.get("/llm/asettled/250/")).status_code for _ in range(5)]

    assert run(body) == [200, 200, 200, 200, 429]
    assert used("tokens", "127.0.0.1") == 1000


def test_the_decorator_alone_settles_too() -> None:
    client = Client(REMOTE_ADDR=ADDRESS)
    assert [client.get("/coded/400/").status_code for _ in range(4)] == [200, 200, 200, 429]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("throttle_middleware")
def test_twenty_parallel_requests_charge_the_sum_of_their_actual_costs() -> None:
    rule("tokens", "/llm/", 1_000_000, unit="hour", algorithm="sliding_window_log")
    get_rules()  # loaded before the threads start
    barrier = threading.Barrier(20)
    costs = [7 * n + 3 for n in range(20)]

    def one(tokens: int) -> None:
        barrier.wait()
        try:
            assert statuses([f"/llm/settled/{tokens}/"]) == [200]
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(c,)) for c in costs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert used("tokens") == sum(costs)


def test_settle_refuses_a_cost_it_cannot_use() -> None:
    request = Client().get  # any object: the arguments are checked first
    for bad in (-1, 2.5, "7", True, None):
        with pytest.raises(ValueError, match="cost"):
            settle(request, bad)  # type: ignore[arg-type]


def test_a_cost_header_is_a_header_name_and_not_for_concurrency() -> None:
    with pytest.raises(ValidationError) as caught:
        Rule(name="t", scope="*", limit=5, cost_header="X Tokens").full_clean()
    assert "cost_header" in caught.value.message_dict
    with pytest.raises(ValidationError) as caught:
        Rule(
            name="t", scope="*", limit=5, algorithm="concurrency", cost_header="X-Tokens"
        ).full_clean()
    assert "cost_header" in caught.value.message_dict
    assert Rule(name="t", scope="*", limit=5, cost_header=" X-Tokens ").full_clean() is None
