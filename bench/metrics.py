"""What the Prometheus metrics add to a request (docs/benchmarks.md, "Metrics on and off")."""

from __future__ import annotations

import argparse
import timeit
from typing import Any

import harness
from harness import Case

N_CLIENTS = 1000

urlpatterns: list[Any] = []  # this module is the ROOT_URLCONF; filled in by urls()


def urls() -> None:
    from django.urls import path

    urlpatterns[:] = [path("p/", harness.plain_view(), name="plain")]


def handler(throttled: bool) -> Any:
    return harness.wsgi_app((*harness.MIDDLEWARE, *((harness.THROTTLE,) if throttled else ())))


def request_case(name: str, app: Any, metrics_on: bool | None = None) -> Case:
    from django_throttle import metrics

    def switch() -> None:  # untimed: before the clock starts
        metrics.switch.on = bool(metrics_on)

    return harness.request_case(name, app, "/p/", N_CLIENTS, None if metrics_on is None else switch)


def hook_costs() -> list[tuple[str, str]]:
    """Nanoseconds per call of each hook a request runs, metrics on, and of the check off."""
    from django_throttle import metrics
    from django_throttle.decision import from_results
    from django_throttle.store import Result

    rule = harness.make_rule(1, "sliding_window_counter", 10**9)
    decision = from_results([Result(rule, "ip:198.18.0.1", True, 10**9, 10, 0.0, 0.0, 0.0)])
    metrics.switch.on = True
    hooks = [
        ("metrics.decided(decision), 1 rule", lambda: metrics.decided(decision)),
        ("metrics.store_timed(seconds)", lambda: metrics.store_timed(0.0003)),
        ("metrics.switch.on (all a hook costs when off)", lambda: metrics.switch.on),
        ("an empty call (the loop's own cost)", lambda: None),
    ]
    n = 100_000
    return [
        (name, f"{min(timeit.repeat(hook, number=n, repeat=5)) / n * 1e9:.0f}")
        for name, hook in hooks
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 rounds x 500 requests")
    parser.add_argument("--memory", action="store_true", help="decide in process memory")
    parser.add_argument(
        "--only", nargs=2, metavar=("on|off", "N"), help="N requests, metrics on or off, no timing"
    )
    args = parser.parse_args()
    rounds, per_round = (3, 500) if args.quick else (7, 2000)
    with harness.RedisServer(cpu=harness.CPU) as server:
        harness.pin_client(harness.CPU)
        harness.configure_site(
            server.url,
            __name__,
            DJANGO_THROTTLE={"METRICS": True, "BACKEND": "memory" if args.memory else "redis"},
        )
        urls()
        harness.create_rules([("*", "sliding_window_counter", 10**9, "hour")])
        from django_throttle import metrics

        assert metrics.switch.on, "METRICS is on only with prometheus_client installed"
        throttled = handler(True)
        if args.only:
            case = request_case("only", throttled, metrics_on=args.only[0] == "on")
            for i in range(int(args.only[1])):
                case.op(case.prep(i))
            return
        cases = [
            request_case("Django, no throttling", handler(False)),
            request_case("ThrottleMiddleware, METRICS off", throttled, metrics_on=False),
            request_case("ThrottleMiddleware, METRICS on", throttled, metrics_on=True),
        ]
        harness.print_machine("prometheus-client")
        harness.interleaved(cases, rounds, per_round, warmup=N_CLIENTS)
        from prometheus_client import REGISTRY

        # Every request of the "on" case was counted and timed, and none of the others.
        observed = REGISTRY.get_sample_value("django_throttle_store_seconds_count")
        expected = N_CLIENTS + rounds * per_round
        assert observed == expected, (observed, expected)
        hooks = hook_costs()
    backend = "in process memory" if args.memory else "Redis"
    print(f"\n## Metrics per request, deciding in {backend} ({rounds} x {per_round} each)\n")
    base, off, on = cases
    rows = [
        (
            c.name,
            f"{c.median_us:.1f}",
            f"{c.p99_us:.1f}",
            "-" if c is base else f"{c.median_us - base.median_us:.1f}",
        )
        for c in cases
    ]
    harness.table(("case", "median µs", "p99 µs", "added µs"), rows)
    # Each round gives every case per_round calls in the same stretch of time: the spread of the
    # per-round differences shows how much of the figure is the machine's noise.
    per_round_us = sorted(
        (
            harness.median(on.samples[r * per_round : (r + 1) * per_round])
            - harness.median(off.samples[r * per_round : (r + 1) * per_round])
        )
        / 1000
        for r in range(rounds)
    )
    print(
        f"\nMETRICS on adds {on.median_us - off.median_us:.1f} µs per request (difference of the "
        f"medians); per round {per_round_us[0]:.1f} to {per_round_us[-1]:.1f} µs, median "
        f"{harness.median(per_round_us):.1f} µs."
    )
    print("\n## The hooks alone\n")
    harness.table(("call", "ns"), hooks)


if __name__ == "__main__":
    main()
