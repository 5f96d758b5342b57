"""Decisions counted after a hung Redis resumes (docs/benchmarks.md, "Production topologies")."""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import harness

SCOPE = "stall"
EVERY = 0.02
BREAKER_INTERVAL = 2.0


def run_once(server: harness.RedisServer, stall: float) -> tuple[int, int, int]:
    import redis
    from django.test import RequestFactory

    from django_throttle import check
    from django_throttle.runtime import replace_runtime

    factory = RequestFactory()
    with redis.Redis.from_url(server.url) as client:
        for key in client.keys("thr:*{*}"):  # the counters, not the rules version
            client.delete(key)
    replace_runtime(handover=False)
    check(factory.get("/"), SCOPE, dry_run=True)  # rules loaded here: the database is this thread's
    admitted = unavailable = 0
    stop = threading.Event()

    def client() -> None:
        nonlocal admitted, unavailable
        while not stop.is_set():
            decision = check(factory.get("/"), SCOPE)
            if decision.unavailable:
                unavailable += 1
            elif decision.allowed:
                admitted += 1
            time.sleep(EVERY)

    thread = threading.Thread(target=client)
    thread.start()
    time.sleep(2)
    server.pause()
    time.sleep(stall)
    server.resume()
    time.sleep(2)
    stop.set()
    thread.join()
    entries = _entries(server)
    return admitted, unavailable, entries


def _entries(server: harness.RedisServer) -> int:
    import redis

    client: Any = redis.Redis.from_url(server.url)
    try:
        keys = [k for k in client.keys("thr:*") if client.type(k) == b"zset"]
        return sum(int(client.zcard(key)) for key in keys)
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--stall", type=float, default=7.0)
    options = parser.parse_args()
    with harness.RedisServer() as server:
        harness.configure_django(
            server.url,
            apps=["django_throttle"],
            migrate=True,
            DJANGO_THROTTLE={
                "TIMEOUT": 0.1,
                "CONNECT_TIMEOUT": 0.1,
                "BREAKER_INTERVAL": BREAKER_INTERVAL,
            },
        )
        from django_throttle.models import Rule

        Rule.objects.create(
            name="stall",
            scope=SCOPE,
            limit=1_000_000,
            unit="hour",
            algorithm="sliding_window_log",
            fail_mode="closed",
        )
        harness.print_machine()
        print(f"\nstall {options.stall:g} s, BREAKER_INTERVAL {BREAKER_INTERVAL:g} s, one process")
        rows = []
        for n in range(1, options.runs + 1):
            admitted, unavailable, entries = run_once(server, options.stall)
            rows.append((n, admitted, unavailable, entries, entries - admitted))
        harness.table(("run", "admitted", "unavailable", "entries in Redis", "extra"), rows)


if __name__ == "__main__":
    main()
