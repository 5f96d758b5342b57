"""Test harness: a real redis-server for the whole run, emptied before every test."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.redis_server import RedisServer

_server: RedisServer | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _server
    _server = RedisServer(os.environ.get("REDIS_URL"))
    if _server.managed:
        _server.start()
    # Settings were imported before any conftest ran; nothing has connected to the cache
    # yet, so pointing it at this server now is enough. Subprocesses read REDIS_URL.
    from django.conf import settings

    settings.CACHES["default"]["LOCATION"] = _server.url
    os.environ["REDIS_URL"] = _server.url


def pytest_unconfigure(config: pytest.Config) -> None:
    if _server is not None:
        _server.close()


@pytest.fixture(scope="session")
def redis_server() -> RedisServer:
    assert _server is not None
    return _server


@pytest.fixture(autouse=True)
def _clean_state(redis_server: RedisServer) -> Iterator[None]:
    """Each test starts with an empty Redis and no cached rules or connections."""
    from django_throttle.runtime import replace_runtime

    if redis_server.managed:
        if redis_server.process is None:
            redis_server.start()
        elif redis_server.paused:
            redis_server.resume()
    client = redis_server.client()
    client.flushall()
    client.close()
    replace_runtime(handover=False)
    yield
    replace_runtime(handover=False)


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[object]:
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def throttle_middleware(settings: Any) -> None:
    """ThrottleMiddleware installed right after AuthenticationMiddleware, so user keys work."""
    middleware = list(settings.MIDDLEWARE)
    auth = middleware.index("django.contrib.auth.middleware.AuthenticationMiddleware")
    middleware.insert(auth + 1, "django_throttle.middleware.ThrottleMiddleware")
    settings.MIDDLEWARE = middleware


class StoreCalls:
    """How many decisions the process sent to its Redis store (INFO commandstats also counts
    the rejection log's own script calls, made by a background thread)."""

    def __init__(self) -> None:
        self.decisions = 0
        self.refunds = 0  # refund.lua calls: give-backs, charges, ended leases


@pytest.fixture
def store_calls(monkeypatch: pytest.MonkeyPatch) -> StoreCalls:
    from django_throttle.store import RedisStore

    calls = StoreCalls()
    decide = RedisStore.decide

    def counted(store: Any, *args: Any, **kwargs: Any) -> Any:
        calls.decisions += 1
        return decide(store, *args, **kwargs)

    refund = RedisStore.refund

    def counted_refund(store: Any, *args: Any, **kwargs: Any) -> Any:
        calls.refunds += 1
        return refund(store, *args, **kwargs)

    monkeypatch.setattr(RedisStore, "decide", counted)
    monkeypatch.setattr(RedisStore, "refund", counted_refund)
    return calls


class PartnerAPI:
    """A partner's order API on a local port, for the Celery recipes' orders/partners.py: the
    orders it received, as (partner, order id), and the status it answers with."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.orders: list[tuple[str, int]] = []
        self.status = 201


@pytest.fixture
def partner_api(settings: Any) -> Iterator[PartnerAPI]:
    """The partner's API, served from a thread; PARTNER_API_URL (the recipe's setting) points
    at it."""
    api = PartnerAPI()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            order = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["order"]
            with api.lock:
                api.orders.append((self.path.strip("/").split("/")[0], order))
            self.send_response(api.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass  # the test reads api.orders, not a log on stderr

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.PARTNER_API_URL = f"http://127.0.0.1:{server.server_address[1]}"
    yield api
    server.shutdown()
    server.server_close()
    thread.join()
