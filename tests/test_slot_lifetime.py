"""A concurrency slot ends when the work ends: under a real ASGI server (uvicorn), a client
that hangs up while its sync view runs does not get its slot back before the view returns
(the view goes on running in its thread), and gets it back then."""

from __future__ import annotations

import socket
import time
from http.client import HTTPConnection
from typing import Any

import pytest
from django.core.handlers.asgi import ASGIHandler
from django.db import connection

from tests import views
from tests.helpers import rule, run
from tests.served import serving
from tests.traffic import asgi_get, database_kept_open, wait_until

pytest.importorskip("uvicorn")

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

UVICORN = ["uvicorn", "tests.served:asgi", "--port", "{port}", "--log-level", "warning"]


def hang_up_after_sending(port: int, path: str) -> None:
    """A client that sends its request, gives the server time to start the view, and leaves."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("path", "middleware"),
    [("/inflight/slow/", True), ("/slow/decorated/", False)],
    ids=["middleware", "decorator-only"],
)
def test_a_sync_view_keeps_its_slot_until_it_returns_though_its_client_hung_up(
    redis_client: Any, path: str, middleware: bool
) -> None:
    scope = "/inflight/" if middleware else "slow-view"
    rule("in flight", scope, 3, algorithm="concurrency", unit="minute")
    with serving(UVICORN, dict(connection.settings_dict), middleware=middleware) as port:
        # Ten clients in a row within one view's run time (2 s): while three views run,
        # every slot is taken, whether their clients are still there or not.
        for _ in range(10):
            hang_up_after_sending(port, path)
        wait_until(lambda: int(redis_client.get("views:running") or 0) == 0, within=30)
        seen = [int(n) for n in redis_client.lrange("views:seen", 0, -1)]
        assert len(seen) >= 3  # the limit was reached
        assert max(seen) <= 3  # and never passed: a view running holds its slot

        # Each slot ended with its view: a client that waits is served.
        client = HTTPConnection("127.0.0.1", port, timeout=10 * views.SLOW_SECONDS)
        client.request("GET", path)
        assert client.getresponse().status == 200
        client.close()


@pytest.mark.usefixtures("throttle_middleware")
def test_asgi_a_response_replaced_by_an_outer_middleware_still_releases(
    settings: Any, redis_client: Any
) -> None:
    """Under ASGI too: ConditionalGetMiddleware answers 304 instead of the view's response,
    which is then never closed; the slot ends with the request all the same."""
    settings.MIDDLEWARE = ["django.middleware.http.ConditionalGetMiddleware", *settings.MIDDLEWARE]
    rule("in flight", "/inflight/", 1, algorithm="concurrency")

    async def body() -> list[Any]:
        with database_kept_open():
            app = ASGIHandler()
            etag = [(b"if-none-match", b'"v1"')]
            return [(await asgi_get(app, "/inflight/etag/", headers=etag))[0] for _ in range(3)]

    assert run(body) == [304, 304, 304]
    assert not any(redis_client.zcard(key) for key in redis_client.keys("thr:*n:{*"))
