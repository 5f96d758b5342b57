"""What a flood from one rejected client costs Redis (docs/benchmarks.md, "Block cache")."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import harness

urlpatterns: list[Any] = []  # this module is the ROOT_URLCONF


def urls() -> None:
    from django.urls import path

    plain = harness.plain_view()
    urlpatterns[:] = [path("hourly/", plain), path("per-second/", plain)]


class CountedDecisions:
    """Counts the decisions the process sends to Redis (other scripts, such as the rejection
    log's pushes, are EVALSHA calls too, so INFO commandstats cannot tell them apart)."""

    def __init__(self) -> None:
        from django_throttle.store import RedisStore

        self.calls = 0
        decide = RedisStore.decide

        def counted(store: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return decide(store, *args, **kwargs)

        RedisStore.decide = counted  # type: ignore[method-assign]


def server_seconds(client: Any) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


def flood(app: Any, path: str, requests: int) -> tuple[int, list[float], float]:
    """(admitted, µs of each rejected request, seconds the flood took)."""
    environ = harness.environ(path, "198.18.0.1")
    admitted = 0
    rejected: list[float] = []
    started = time.perf_counter()
    for _ in range(requests):
        before = time.perf_counter_ns()
        response = app(dict(environ), harness.start_response)
        spent = (time.perf_counter_ns() - before) / 1000
        if response.status_code == 429:
            rejected.append(spent)
        else:
            assert response.status_code == 200, response.status_code
            admitted += 1
    return admitted, rejected, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    options = parser.parse_args()
    with harness.RedisServer(cpu=harness.CPU) as server:
        harness.pin_client(harness.CPU)
        harness.configure_throttled(
            server.url,
            __name__,
            "file:blocks?mode=memory&cache=shared",  # the recorder's thread sees it
            DEBUG_PROPAGATE_EXCEPTIONS=True,
        )
        urls()
        harness.create_rules([("/hourly/", "fixed_window", 10, "hour")])
        harness.create_rules([("/per-second/", "fixed_window", 10, "second")])
        import redis
        from django.core.handlers.wsgi import WSGIHandler

        client = redis.Redis.from_url(server.url)
        decisions = CountedDecisions()
        rows = []
        for block_cache in (True, False):
            harness.change_throttle(BLOCK_CACHE=block_cache)
            app = WSGIHandler()
            for path, period in (("/hourly/", 3600.0), ("/per-second/", 1.0)):
                client.flushdb()
                calls = decisions.calls
                first = server_seconds(client)
                admitted, rejected, _ = flood(app, path, options.requests)
                last = server_seconds(client)
                calls = decisions.calls - calls
                periods = int(last // period) - int(first // period) + 1  # windows spanned
                rows.append(
                    (
                        "on" if block_cache else "off",
                        f"{path} (10 per {'hour' if period == 3600 else 'second'})",
                        options.requests,
                        admitted,
                        calls,
                        periods,
                        f"{(calls - admitted) / periods:.1f}",
                        f"{statistics.median(rejected):.1f}",
                    )
                )
        client.close()
        from django_throttle import rejection_log

        rejection_log.collect()  # while the server is up: nothing left for the exit's flush
        harness.print_machine()
        print(f"\n## A flood from one client, {options.requests} requests per row\n")
        harness.table(
            (
                "BLOCK_CACHE",
                "rule",
                "requests",
                "admitted",
                "decisions sent to Redis",
                "rejection periods",
                "rejection calls per period",
                "median µs of a rejection",
            ),
            rows,
        )


if __name__ == "__main__":
    main()
