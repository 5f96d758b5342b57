"""ThrottleMiddleware under ASGI beside WSGI (docs/benchmarks.md, "The middleware end to end")."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import e2e
import harness
from harness import Case

N_CLIENTS = 1000
# One SQLite database in memory for every thread: under ASGI, Django's sync parts (and the
# middleware's, through sync_to_async) run in other threads than the one that made the rule.
DATABASE = "file:bench-asgi?mode=memory&cache=shared"

urlpatterns: list[Any] = []  # this module is the ROOT_URLCONF; filled in by urls()


def urls() -> None:
    from django.urls import path

    urlpatterns[:] = [path("p/", harness.plain_view(), name="plain")]


def middleware(throttled: bool, extra: str | None = None) -> None:
    """The chain a handler builds when it is made, from the settings of now."""
    from django.conf import settings

    throttle = [harness.THROTTLE] if throttled else []
    settings.MIDDLEWARE = [*harness.MIDDLEWARE, *throttle, *([extra] if extra else [])]


# What AsyncRoundTripMiddleware awaits, set by main(): redis.asyncio's EVALSHA of `return 1`.
_floor: dict[str, Callable[[], Awaitable[Any]]] = {}


class AsyncRoundTripMiddleware:
    """One redis.asyncio EVALSHA of ``return 1`` per request, awaited on the loop; nothing else."""

    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Awaitable[Any]]) -> None:
        from asgiref.sync import markcoroutinefunction

        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request: Any) -> Any:
        await _floor["async"]()
        return await self.get_response(request)


WSGI_FLOOR = "WSGI: floor, a middleware making one raw EVALSHA"
ASGI_FLOOR = "ASGI: floor, a middleware awaiting one redis.asyncio EVALSHA"


def wsgi_case(name: str, throttled: bool, path: str, extra: str | None = None) -> Case:
    return harness.request_case(name, e2e.handler(throttled, extra), path, N_CLIENTS)


def scope(path: str, client_ip: str) -> dict[str, Any]:
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
        "headers": [(b"host", b"testserver")],
        "client": (client_ip, 40000),
        "server": ("testserver", 80),
    }


async def asgi_get(app: Any, request_scope: dict[str, Any]) -> int:
    """One GET through the ASGI app; its status. The client stays connected until Django is
    done (Django cancels its wait for a disconnect then)."""
    sent: list[dict[str, Any]] = []
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(request_scope, receive, send)
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


def asgi_case(
    name: str,
    throttled: bool,
    path: str,
    loop: asyncio.AbstractEventLoop,
    extra: str | None = None,
) -> Case:
    from django.core.handlers.asgi import ASGIHandler

    middleware(throttled, extra)
    app = ASGIHandler()
    scopes = [scope(path, a) for a in harness.addresses(N_CLIENTS)]

    def call(request_scope: dict[str, Any]) -> None:
        status = loop.run_until_complete(asgi_get(app, request_scope))
        assert status == 200, status

    return Case(name, call, lambda i: dict(scopes[i % N_CLIENTS]))


def async_evalsha(url: str, loop: asyncio.AbstractEventLoop) -> Case:
    """redis.asyncio's EVALSHA of ``return 1``, one ``run_until_complete`` each, as a request."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(url, socket_timeout=1.0)
    sha = loop.run_until_complete(client.script_load("return 1"))
    _floor["async"] = lambda: client.evalsha(sha, 0)
    return Case(
        "raw EVALSHA `return 1` (redis.asyncio)",
        lambda _: loop.run_until_complete(client.evalsha(sha, 0)),
    )


def evalsha_per_request(url: str, case: Case, n: int = 20) -> float:
    """EVALSHA calls per request through ``case`` (INFO commandstats): 1 if the middleware
    decides in Redis once per request."""
    import redis

    client = redis.Redis.from_url(url)
    client.config_resetstat()
    for i in range(n):
        case.op(case.prep(i))
    calls = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    client.close()
    return calls / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 rounds x 500 requests")
    args = parser.parse_args()
    rounds, per_round = (3, 500) if args.quick else (7, 2000)
    path = "/p/"
    with harness.RedisServer(cpu=harness.CPU) as server:
        harness.pin_client(harness.CPU)  # before the loop and any thread: they inherit CPU 0
        harness.configure_site(server.url, __name__, database=DATABASE)
        urls()
        e2e.floor_calls(server.url)
        harness.create_rules([("*", "sliding_window_counter", 10**9, "hour")])
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        cases = [
            harness.raw_evalsha(server.url),
            async_evalsha(server.url, loop),
            wsgi_case("WSGI: Django, no throttling", False, path),
            wsgi_case("WSGI: ThrottleMiddleware, 1 rule", True, path),
            asgi_case("ASGI: Django, no throttling", False, path, loop),
            asgi_case("ASGI: ThrottleMiddleware, 1 rule", True, path, loop),
            wsgi_case(WSGI_FLOOR, False, path, "e2e.RoundTripMiddleware"),
            asgi_case(ASGI_FLOOR, False, path, loop, f"{__name__}.AsyncRoundTripMiddleware"),
        ]
        harness.print_machine()
        try:
            harness.interleaved(cases, rounds, per_round, warmup=N_CLIENTS)
            per_request = {c.name[:4]: evalsha_per_request(server.url, c) for c in cases[3:6:2]}
        finally:
            loop.close()
    print(
        "\n## Middleware per request under WSGI and ASGI, one `*` rule (sliding_window_counter) "
        f"in Redis, a sync view ({rounds} x {per_round} each)\n"
    )
    raw = cases[0].median_us
    base = {"WSGI": cases[2].median_us, "ASGI": cases[4].median_us}
    added: dict[str, float] = {}
    rows = []
    for c in cases:
        handler = c.name[:4]
        plus = c.median_us - base[handler] if handler in base and c not in cases[2:5:2] else None
        if plus is not None and "Throttle" in c.name:
            added[handler] = plus
        rows.append(
            (
                c.name,
                f"{c.median_us:.1f}",
                f"{c.p99_us:.1f}",
                "-" if plus is None else f"{plus:.1f}",
                "-" if plus is None else f"{plus / raw:.2f}x",
            )
        )
    harness.table(("case", "median µs", "p99 µs", "added µs", "added / raw EVALSHA"), rows)
    print(
        f"\nAdded time under ASGI {added['ASGI']:.1f} µs, under WSGI {added['WSGI']:.1f} µs: "
        f"ASGI / WSGI {added['ASGI'] / added['WSGI']:.2f}x (target for both: at most 1.3x the "
        f"raw EVALSHA, {1.3 * raw:.1f} µs). EVALSHA per request with the middleware: "
        f"{per_request['WSGI']:g} under WSGI, {per_request['ASGI']:g} under ASGI."
    )


if __name__ == "__main__":
    main()
