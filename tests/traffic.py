"""Traffic for the failover tests: requests through Django's own WSGI and ASGI handlers, from
several threads (or tasks) at once, each answer recorded with when it was sent and received.

The rules must be in the database before the traffic starts: the handlers' threads read them
through the rule cache, which the test's thread loads first.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.core.handlers.asgi import ASGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client


@dataclass(frozen=True)
class Answer:
    path: str
    sent: float  # time.monotonic()
    received: float
    status: int | None  # None: no response (the client went away)
    retry_after: str | None


@contextmanager
def database_kept_open() -> Iterator[None]:
    """Django's handlers close the database connection at each request's start and end; the
    test clients keep the test database open, and so must a handler driven directly."""
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    try:
        yield
    finally:
        for signal in (request_started, request_finished):
            signal.connect(close_old_connections)


def _scope(
    path: str, client_ip: str, headers: Sequence[tuple[bytes, bytes]] = ()
) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": (client_ip, 40000),
        "server": ("testserver", 80),
    }


async def asgi_get(
    app: ASGIHandler,
    path: str,
    disconnect_after: float | None = None,
    client_ip: str = "127.0.0.1",
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> tuple[int | None, str | None]:
    """One GET through Django's ASGI handler: (status, Retry-After). With ``disconnect_after``,
    the client disconnects after that many seconds and Django cancels the request's task."""
    sent: list[dict[str, Any]] = []
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        if disconnect_after is None:
            await asyncio.Event().wait()  # connected until Django is done
        await asyncio.sleep(disconnect_after or 0)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(_scope(path, client_ip, headers), receive, send)
    start = next((m for m in sent if m["type"] == "http.response.start"), None)
    if start is None:
        return None, None
    headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
    return start["status"], headers.get("retry-after")


class Traffic:
    """``workers`` threads (WSGI) or tasks (ASGI) sending GETs in turn over ``paths`` until
    stopped; ``answers`` holds every request's outcome."""

    def __init__(self, paths: Sequence[str], workers: int = 4, asgi: bool = False) -> None:
        self.paths = list(paths)
        self.workers = workers
        self.asgi = asgi
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def __enter__(self) -> Traffic:
        if self.asgi:
            self._threads = [threading.Thread(target=self._asgi_loop, daemon=True)]
        else:
            self._threads = [
                threading.Thread(target=self._wsgi_worker, args=(n,), daemon=True)
                for n in range(self.workers)
            ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        assert not self.errors, self.errors

    def _record(self, answer: Answer) -> None:
        with self._lock:
            self.answers.append(answer)

    def _wsgi_worker(self, n: int) -> None:
        client = Client()
        try:
            for path in itertools.islice(itertools.cycle(self.paths), n, None):
                if self._stop.is_set():
                    return
                sent = time.monotonic()
                response = client.get(path)
                self._record(
                    Answer(
                        path,
                        sent,
                        time.monotonic(),
                        response.status_code,
                        response.headers.get("Retry-After"),
                    )
                )
                time.sleep(0.002)
        except BaseException as exc:  # surfaced by __exit__
            self.errors.append(exc)

    def _asgi_loop(self) -> None:
        try:
            asyncio.run(self._asgi_workers())
        except BaseException as exc:
            self.errors.append(exc)

    async def _asgi_workers(self) -> None:
        app = ASGIHandler()

        async def worker(n: int) -> None:
            for path in itertools.islice(itertools.cycle(self.paths), n, None):
                if self._stop.is_set():
                    return
                sent = time.monotonic()
                status, retry_after = await asgi_get(app, path)
                self._record(Answer(path, sent, time.monotonic(), status, retry_after))
                await asyncio.sleep(0.002)

        await asyncio.gather(*(worker(n) for n in range(self.workers)))

    # -- reading the answers

    def on(self, path: str) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if a.path == path]

    def first_ok_after(self, path: str, moment: float) -> Answer | None:
        return next((a for a in self.on(path) if a.sent >= moment and a.status == 200), None)


def wait_until(condition: Any, within: float, step: float = 0.01) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {within} s")
        time.sleep(step)
