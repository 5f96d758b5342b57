"""ThrottleMiddleware's cost per request (docs/benchmarks.md, "The middleware end to end"); with
--metrics, what the Prometheus metrics add to it (docs/benchmarks.md, "Metrics on and off")."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import harness
from engine import HOUR, MINIMAL_COUNTS

N_CLIENTS = 1000
RULES = ("*", "/api/", r"^/api/x/$", "named", "dec")  # /p/ matches the first, /api/x/ all
ALGORITHMS = ("sliding_window_counter", "token_bucket", "fixed_window")

ONE_RULE = "ThrottleMiddleware, 1 rule"
ROUND_TRIP = "floor: a middleware making one raw EVALSHA `return 1`"
MINIMAL_WINDOW = "floor: a middleware running the minimal INCRBY fixed window"
TARGET = 1.3  # issue 14: the added time of one rule, at most this times the raw EVALSHA

urlpatterns: list[Any] = []  # this module is the ROOT_URLCONF; filled in by urls()


def urls() -> None:
    from django.urls import path

    from django_throttle import throttle

    plain = harness.plain_view()
    urlpatterns[:] = [
        path("p/", plain, name="plain"),
        path("api/x/", throttle("dec")(plain), name="named"),
    ]


def handler(throttled: bool, extra: str | None = None) -> Any:
    throttle = (harness.THROTTLE,) if throttled else ()
    return harness.wsgi_app((*harness.MIDDLEWARE, *throttle, *([extra] if extra else [])))


# What the floor middlewares call, set by main(): redis-py's EVALSHA of `return 1`, and of the
# minimal fixed window on one key.
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


def floor_calls(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=1.0)
    raw, window = client.script_load("return 1"), client.script_load(MINIMAL_COUNTS)
    _floor["raw"] = lambda: client.evalsha(raw, 0)
    _floor["window"] = lambda key: client.evalsha(window, 1, key, HOUR, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 rounds x 500 requests")
    parser.add_argument("--memory", action="store_true", help="decide in process memory")
    parser.add_argument("--metrics", action="store_true", help="1 rule, METRICS off and on")
    args = parser.parse_args()
    rounds, per_round = (3, 500) if args.quick else (7, 2000)
    throttle: dict[str, Any] = {"BACKEND": "memory" if args.memory else "redis"}
    if args.metrics:
        throttle["METRICS"] = True
    with harness.RedisServer(cpu=harness.CPU) as server:
        harness.pin_client(harness.CPU)
        harness.configure_site(server.url, __name__, DJANGO_THROTTLE=throttle)
        urls()
        floor_calls(server.url)
        harness.create_rules(
            [(scope, ALGORITHMS[i % 3], 10**9, "hour") for i, scope in enumerate(RULES)]
        )
        throttled = handler(True)
        cases = [
            harness.raw_evalsha(server.url),
            harness.request_case("Django, no throttling", handler(False), "/p/"),
            harness.request_case(ONE_RULE, throttled, "/p/"),
            harness.request_case("ThrottleMiddleware, 5 rules", throttled, "/api/x/"),
            harness.request_case(
                ROUND_TRIP, handler(False, f"{__name__}.RoundTripMiddleware"), "/p/"
            ),
            harness.request_case(
                MINIMAL_WINDOW, handler(False, f"{__name__}.MinimalWindowMiddleware"), "/p/"
            ),
        ]
        if args.metrics:  # the switch flipped before each request, untimed
            from django_throttle import metrics

            assert metrics.switch.on, "METRICS is on only with prometheus_client installed"
            cases[2:] = [
                harness.request_case(
                    f"{ONE_RULE}, METRICS {state}",
                    throttled,
                    "/p/",
                    before=lambda on=state == "on": setattr(metrics.switch, "on", on),
                )
                for state in ("off", "on")
            ]
        harness.print_machine("prometheus-client")
        harness.interleaved(cases, rounds, per_round, warmup=N_CLIENTS)
    backend = "in process memory" if args.memory else "Redis"
    print(f"\n## Middleware per request, deciding in {backend} ({rounds} x {per_round} each)\n")
    raw, base = cases[0].median_us, cases[1].median_us
    rows = []
    for c in cases:
        added = None if c is cases[0] or c is cases[1] else c.median_us - base
        target = ""
        if c.name == ONE_RULE and added is not None:
            target = f"≤ {TARGET:.1f}x: {'met' if added / raw <= TARGET else 'not met'}"
        rows.append(
            (
                c.name,
                f"{c.median_us:.1f}",
                f"{c.p99_us:.1f}",
                "-" if added is None else f"{added:.1f}",
                "-" if added is None else f"{added / raw:.2f}x",
                target,
            )
        )
    harness.table(
        ("case", "median µs", "p99 µs", "added µs", "added / raw EVALSHA", "target"), rows
    )


if __name__ == "__main__":
    main()
