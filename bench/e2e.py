"""ThrottleMiddleware's cost per request (docs/benchmarks.md, "The middleware end to end"):
through Django's WSGI handler; with --asgi, under ASGIHandler beside WSGIHandler; with
--metrics, what the Prometheus metrics add to it (docs/benchmarks.md, "Metrics on and off")."""

from __future__ import annotations

import argparse
import asyncio
import functools
from collections.abc import Callable
from typing import Any

import harness
from django.utils.decorators import async_only_middleware
from engine import HOUR, MINIMAL_COUNTS
from harness import Case

N_CLIENTS = 1000
RULES = ("*", "/api/", r"^/api/x/$", "named", "dec")  # /p/ matches the first, /api/x/ all
ALGORITHMS = ("sliding_window_counter", "token_bucket", "fixed_window")
# One SQLite database in memory for every thread: under ASGI, Django's sync parts (and the
# middleware's, through sync_to_async) run in other threads than the one that made the rule.
DATABASE = "file:bench-e2e?mode=memory&cache=shared"

ONE_RULE = "ThrottleMiddleware, 1 rule"
TARGET = 1.3  # issue 14: the added time of one rule, at most this times the raw EVALSHA
WSGI_FLOOR = "WSGI: floor, a middleware making one raw EVALSHA"
ASYNC_FLOOR = "ASGI: floor, a middleware awaiting one redis.asyncio EVALSHA"
LEAN_FLOOR = "ASGI: floor, a middleware awaiting one lean-connection EVALSHA"
LEAN_WINDOW = "ASGI: floor, a middleware awaiting the minimal fixed window (lean connection)"
FALLBACK = "ASGI: ThrottleMiddleware, 1 rule, on redis.asyncio's connections"
BARE = "ASGI: ThrottleMiddleware, 1 rule, HEADERS and METRICS off"
ASGI_TARGET = 1.3  # issue 24: the added time under ASGI, at most this times that under WSGI
FLOOR_TARGETS = {"ASGI": 1.5, "WSGI": 1.3}  # issue 29: added time over its floor's

urlpatterns: list[Any] = []  # this module is the ROOT_URLCONF; filled in by urls()


def urls() -> None:
    from django.urls import path

    from django_throttle import throttle

    plain = harness.plain_view()
    urlpatterns[:] = [
        path("p/", plain, name="plain"),
        path("api/x/", throttle("dec")(plain), name="named"),
    ]


def handler(throttled: bool, extra: str | None = None, asgi: bool = False) -> Any:
    """Django's WSGI or ASGI handler: it builds its middleware chain from the settings of now."""
    from django.conf import settings
    from django.core.handlers.asgi import ASGIHandler
    from django.core.handlers.wsgi import WSGIHandler

    throttle = [harness.THROTTLE] if throttled else []
    settings.MIDDLEWARE = [*harness.MIDDLEWARE, *throttle, *([extra] if extra else [])]
    return ASGIHandler() if asgi else WSGIHandler()


# What the floor middlewares call (floor_calls(), async_evalshas()): EVALSHA of `return 1` by
# redis-py, redis.asyncio or the lean connection, or of the minimal fixed window ("window").
_floor: dict[str, Callable[..., Any]] = {}


class RoundTripMiddleware:
    """One raw EVALSHA of ``return 1`` per request, nothing else."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        _floor["raw"]()
        return self.get_response(request)


class MinimalWindowMiddleware(RoundTripMiddleware):
    """One EVALSHA of the minimal INCRBY+PEXPIRE fixed window on the client's key."""

    def __call__(self, request: Any) -> Any:
        _floor["window"]("thr:e2e:" + request.META["REMOTE_ADDR"])
        return self.get_response(request)


def awaiting(client: str) -> Callable[[Any], Any]:
    """A middleware that awaits one EVALSHA per request on the loop: of ``return 1`` through
    redis.asyncio ("async") or the lean connection the async decision store uses ("lean"), or
    of the minimal fixed window on the client's key through the lean one ("lean-window")."""

    @async_only_middleware
    def floor(get_response: Callable[[Any], Any]) -> Callable[[Any], Any]:
        async def middleware(request: Any) -> Any:
            await _floor[client](request)
            return await get_response(request)

        return middleware

    return floor


AsyncRoundTripMiddleware, LeanRoundTripMiddleware = awaiting("async"), awaiting("lean")
LeanWindowRoundTripMiddleware = awaiting("lean-window")


def floor_calls(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=1.0)
    raw, window = client.script_load("return 1"), client.script_load(MINIMAL_COUNTS)
    _floor["raw"] = lambda: client.evalsha(raw, 0)
    _floor["window"] = lambda key: client.evalsha(window, 1, key, HOUR, 1)


def async_evalshas(url: str, loop: asyncio.AbstractEventLoop) -> list[Case]:
    """EVALSHA of ``return 1`` through redis.asyncio and through the decision store's lean
    connection (store/aio_connection.py), one ``run_until_complete`` each, as a request."""
    import redis.asyncio

    from django_throttle.store.aio_connection import LeanConnectionStack, async_stack

    client = redis.asyncio.Redis.from_url(url, socket_timeout=1.0)
    lean = redis.asyncio.Redis.from_url(url, socket_timeout=1.0)
    stack = async_stack(lean.connection_pool, one_deadline=True)
    assert isinstance(stack, LeanConnectionStack)
    sha = loop.run_until_complete(client.script_load("return 1"))
    window = loop.run_until_complete(client.script_load(MINIMAL_COUNTS))
    _floor["async"] = lambda _: client.evalsha(sha, 0)
    _floor["lean"] = lambda _: stack.run_script(sha, "return 1", 0)
    _floor["lean-window"] = lambda request: stack.run_script(
        window, MINIMAL_COUNTS, 1, "thr:e2e:" + request.META["REMOTE_ADDR"], HOUR, 1
    )
    return [
        Case(
            f"raw EVALSHA `return 1` ({name})",
            lambda _, k=k: loop.run_until_complete(_floor[k](None)),
        )
        for k, name in (("async", "redis.asyncio"), ("lean", "lean asyncio connection"))
    ]


def asgi_case(
    name: str,
    throttled: bool,
    loop: asyncio.AbstractEventLoop,
    extra: str | None = None,
    before: Callable[[], None] = lambda: None,
) -> Case:
    """GETs of /p/ through Django's ASGI handler on ``loop``, as the tests send them;
    ``before`` runs untimed before each one."""
    from tests.traffic import asgi_get

    app, addrs = handler(throttled, extra, asgi=True), harness.addresses(N_CLIENTS)

    def call(address: str) -> None:
        status, _ = loop.run_until_complete(asgi_get(app, "/p/", client_ip=address))
        assert status == 200, status

    return Case(name, call, lambda i: before() or addrs[i % N_CLIENTS])


def extras(on: bool) -> Callable[[], None]:
    """Turns the rate-limit headers of admitted responses (HEADERS) and the metrics on or off."""
    from django_throttle import metrics
    from django_throttle.engine.request_state import Parts
    from django_throttle.runtime import current

    def switch() -> None:
        metrics.switch.on = on
        current.runtime.part(Parts).headers = on

    return switch


def fallback_case() -> tuple[Case, asyncio.AbstractEventLoop]:
    """ASGI with ThrottleMiddleware deciding on redis.asyncio's connections (the fallback where
    the lean connection does not serve a pool): on a loop of its own, whose store is made
    while hiredis is hidden from store/aio_connection.py."""
    from django_throttle.store import aio_connection

    loop = asyncio.new_event_loop()
    case = asgi_case(FALLBACK, True, loop, before=extras(True))
    aio_connection.HIREDIS = False
    try:
        case.op(case.prep(0))  # the loop's store is made now
    finally:
        aio_connection.HIREDIS = True
    return case, loop


def evalsha_per_request(url: str, case: Case, n: int = 20) -> float:
    """EVALSHA calls per request through ``case`` (INFO commandstats): 1 if the middleware
    decides in Redis once per request."""
    import redis

    with redis.Redis.from_url(url) as client:
        client.config_resetstat()
        for i in range(n):
            case.op(case.prep(i))
        return client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0) / n


def report(cases: list[Case], base: dict[str, Case], targets: bool) -> dict[str, float]:
    """Each case beside the request without throttling of its handler (``base``, by the name's
    first 4 characters, "" for WSGI alone): the added time, also over the raw EVALSHA (the
    first case); with ``targets``, issue 14's verdict on one rule. The added times by name."""
    raw, added, rows = cases[0].median_us, {}, []
    for c in cases:
        of = base.get(c.name[:4], base.get(""))
        plus = None if c is cases[0] or of is None or c is of else c.median_us - of.median_us
        verdict = ""
        if plus is not None:
            added[c.name] = plus
            if c.name == ONE_RULE:
                verdict = f"≤ {TARGET:.1f}x: {'met' if plus / raw <= TARGET else 'not met'}"
        over = ("-", "-") if plus is None else (f"{plus:.1f}", f"{plus / raw:.2f}x")
        row = (c.name, f"{c.median_us:.1f}", f"{c.p99_us:.1f}", *over)
        rows.append((*row, verdict) if targets else row)
    header = ("case", "median µs", "p99 µs", "added µs", "added / raw EVALSHA")
    harness.table((*header, *(["target"] if targets else [])), rows)
    return added


def asgi(url: str, rounds: int, per_round: int) -> None:
    """WSGI and ASGI with one fixed-window rule, each beside its floor."""
    harness.create_rules([("*", "fixed_window", 10**9, "hour")])
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    fallback, fallback_loop = fallback_case()
    floor, on = f"{__name__}.{{}}RoundTripMiddleware", extras(True)
    cases = [
        harness.raw_evalsha(url),
        *async_evalshas(url, loop),
        harness.request_case("WSGI: Django, no throttling", handler(False), "/p/"),
        harness.request_case("WSGI: ThrottleMiddleware, 1 rule", handler(True), "/p/", before=on),
        asgi_case("ASGI: Django, no throttling", False, loop),
        asgi_case("ASGI: ThrottleMiddleware, 1 rule", True, loop, before=on),
        fallback,
        harness.request_case(WSGI_FLOOR, handler(False, floor.format("")), "/p/"),
        asgi_case(ASYNC_FLOOR, False, loop, floor.format("Async")),
        asgi_case(LEAN_FLOOR, False, loop, floor.format("Lean")),
        asgi_case(LEAN_WINDOW, False, loop, floor.format("LeanWindow")),
        asgi_case(BARE, True, loop, before=extras(False)),
    ]
    wsgi_base, wsgi_throttled, asgi_base, asgi_throttled = cases[3:7]
    harness.print_machine()
    try:
        harness.interleaved(cases, rounds, per_round, warmup=N_CLIENTS)
        per_request = {c.name[:4]: evalsha_per_request(url, c) for c in cases[4:7:2]}
    finally:
        loop.close()
        fallback_loop.close()
    print(
        "\n## Middleware per request under WSGI and ASGI, one `*` rule (fixed_window) "
        f"in Redis, a sync view ({rounds} x {per_round} each)\n"
    )
    added = report(cases, {"WSGI": wsgi_base, "ASGI": asgi_base}, targets=False)
    wsgi_added, asgi_added = added[wsgi_throttled.name], added[asgi_throttled.name]
    # Issue 29: each handler's middleware against a middleware that only makes one EVALSHA on
    # the same kind of connection (the floor), added time over added time.
    for name, own, of in (("ASGI", asgi_added, LEAN_FLOOR), ("WSGI", wsgi_added, WSGI_FLOOR)):
        ratio, target = own / added[of], FLOOR_TARGETS[name]
        print(
            f"{name}: ThrottleMiddleware adds {own:.1f} µs, its floor {added[of]:.1f} µs: "
            f"{ratio:.2f}x (target: at most {target}x: {'met' if ratio <= target else 'not met'})"
        )
    # How much of the ASGI gap is the script's own work in Redis, which `return 1` skips.
    print(
        f"ASGI: against a floor running the minimal fixed window ({added[LEAN_WINDOW]:.1f} µs): "
        f"{asgi_added / added[LEAN_WINDOW]:.2f}x; with HEADERS and METRICS off it adds "
        f"{added[BARE]:.1f} µs: {added[BARE] / added[LEAN_FLOOR]:.2f}x its floor"
    )
    ratio, before = asgi_added / wsgi_added, added[FALLBACK]
    print(
        f"\nASGI added / WSGI added: {asgi_added:.1f} / {wsgi_added:.1f} µs = {ratio:.2f}x "
        f"(target: at most {ASGI_TARGET}x: {'met' if ratio <= ASGI_TARGET else 'not met'}). "
        f"EVALSHA per request with the middleware: {per_request['WSGI']:g} under WSGI, "
        f"{per_request['ASGI']:g} under ASGI. On redis.asyncio's connections the middleware "
        f"adds {before:.1f} µs under ASGI: {before / wsgi_added:.2f}x its WSGI figure."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 rounds x 500 requests")
    parser.add_argument("--memory", action="store_true", help="decide in process memory")
    parser.add_argument("--metrics", action="store_true", help="1 rule, METRICS off and on")
    parser.add_argument("--asgi", action="store_true", help="1 rule under ASGI beside WSGI")
    args = parser.parse_args()
    rounds, per_round = (3, 500) if args.quick else (12, 1000) if args.asgi else (7, 2000)
    throttle: dict[str, Any] = {"BACKEND": "memory" if args.memory else "redis"}
    if args.metrics:
        throttle["METRICS"] = True
    with harness.RedisServer(cpu=harness.CPU) as server:
        harness.pin_client(harness.CPU)  # before the loop and any thread: they inherit the CPU
        harness.configure_site(server.url, __name__, database=DATABASE, DJANGO_THROTTLE=throttle)
        urls()
        floor_calls(server.url)
        if args.asgi:
            return asgi(server.url, rounds, per_round)
        rules = [(scope, ALGORITHMS[i % 3], 10**9, "hour") for i, scope in enumerate(RULES)]
        harness.create_rules(rules)
        throttled = handler(True)
        cases = [
            harness.raw_evalsha(server.url),
            harness.request_case("Django, no throttling", handler(False), "/p/"),
            harness.request_case(ONE_RULE, throttled, "/p/"),
            harness.request_case("ThrottleMiddleware, 5 rules", throttled, "/api/x/"),
        ]
        for floor, does in (
            ("RoundTrip", "making one raw EVALSHA `return 1`"),
            ("MinimalWindow", "running the minimal INCRBY fixed window"),
        ):
            app = handler(False, f"{__name__}.{floor}Middleware")
            cases.append(harness.request_case(f"floor: a middleware {does}", app, "/p/"))
        if args.metrics:  # the switch flipped before each request, untimed
            from django_throttle import metrics

            assert metrics.switch.on, "METRICS is on only with prometheus_client installed"
            del cases[2:]
            for state in ("off", "on"):
                switch = functools.partial(setattr, metrics.switch, "on", state == "on")
                name = f"{ONE_RULE}, METRICS {state}"
                cases.append(harness.request_case(name, throttled, "/p/", before=switch))
        harness.print_machine("prometheus-client")
        harness.interleaved(cases, rounds, per_round, warmup=N_CLIENTS)
    backend = "in process memory" if args.memory else "Redis"
    print(f"\n## Middleware per request, deciding in {backend} ({rounds} x {per_round} each)\n")
    report(cases, {"": cases[1]}, targets=True)


if __name__ == "__main__":
    main()
