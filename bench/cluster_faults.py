"""One sick Redis Cluster master under load (docs/bounds.md, "Faults on a Redis Cluster stay with
their master")."""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import harness
from topologies import Cluster

DATABASE = "file:bench-cluster-faults?mode=memory&cache=shared"
CLOSED = "/closed/"
THREADS, CLIENTS, PAUSE = 4, 256, 0.002
SETTINGS = {"TIMEOUT": 0.1, "CONNECT_TIMEOUT": 0.1, "BREAKER_INTERVAL": 2.0}
urlpatterns: list[Any] = []


def urls() -> None:
    from django.urls import path

    urlpatterns[:] = [path("closed/", harness.plain_view())]


def slot_master(cluster: Any, identity: str) -> int:
    from django_throttle.state_keys import client_tag
    from django_throttle.store.cluster import slot_of_tag

    return int(cluster.node_for_slot(slot_of_tag(client_tag(identity))))


@contextlib.contextmanager
def sick(cluster: Any, port: int, fault: str) -> Iterator[None]:
    import redis
    from redis.crc import key_slot

    node = cluster.node(port)
    if fault == "pause":
        node.pause()
        try:
            yield
        finally:
            node.resume()
        return
    if fault == "kill":
        node.kill()
        try:
            yield
        finally:
            node.start()
        return
    with contextlib.closing(redis.Redis(port=port, socket_timeout=5)) as client:
        key = next(
            f"{{fill{i}}}"
            for i in range(100_000)
            if cluster.node_for_slot(key_slot(f"{{fill{i}}}".encode())) == port
        )
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 2_000_000)
        n = 0
        try:
            while True:
                client.set(f"{key}:{n}", b"x" * 100_000)
                n += 1
        except redis.exceptions.OutOfMemoryError:
            pass
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 1_000_000)
        try:
            yield
        finally:
            client.config_set("maxmemory", 0)
            for i in range(n):
                client.delete(f"{key}:{i}")


def decide_cost(cluster: Any) -> list[tuple[str, str]]:
    from django_throttle.compiled import build_rule
    from django_throttle.engine import deciding
    from django_throttle.store import Check, get_store

    rules = [
        build_rule(id=n, name=f"r{n}", algorithm="fixed_window", limit=10**9, period=3600)
        for n in (1, 2, 3)
    ]
    spread: dict[int, str] = {}
    for i in range(1000):
        spread.setdefault(slot_master(cluster, f"ip:10.0.0.{i}"), f"ip:10.0.0.{i}")
    identities = list(spread.values())
    cases = {
        "1 slot group (3 rules, 1 client)": [Check(r, identities[0]) for r in rules],
        "3 slot groups on 3 masters": [
            Check(r, i) for r, i in zip(rules, identities[:3], strict=True)
        ],
    }
    store = get_store().backend()
    timed = {}
    for name, checks in cases.items():
        timed[name, "through the breakers"] = (lambda c: lambda: deciding.decide(c))(checks)
        timed[name, "the store alone"] = (lambda c: lambda: store.decide(c))(checks)
    samples: dict[tuple[str, str], list[int]] = {key: [] for key in timed}
    for op in timed.values():
        for _ in range(300):
            op()
    for _ in range(40):  # blocks of 100 calls, the cases taking turns
        for key, op in timed.items():
            for _ in range(100):
                t = time.perf_counter_ns()
                op()
                samples[key].append(time.perf_counter_ns() - t)
    return [
        (name, how, f"{statistics.median(values) / 1000:.1f}")
        for (name, how), values in samples.items()
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--fault", choices=("oom", "pause", "kill"), default="oom")
    args = parser.parse_args()
    with harness.RedisServer() as cache, Cluster(node_timeout_ms=60_000) as cluster:
        harness.configure_throttled(
            cache.url,
            __name__,
            DATABASE,
            DJANGO_THROTTLE={**SETTINGS, "CLUSTER_URL": cluster.url},
        )
        urls()
        from django.core.handlers.wsgi import WSGIHandler

        from django_throttle.models import Rule

        Rule.objects.create(
            name="closed", scope=CLOSED, limit=10**9, unit="hour", fail_mode="closed",
            algorithm="fixed_window",
        )  # fmt: skip
        harness.print_machine("django-redis")
        addresses = harness.addresses(CLIENTS, prefix="198.19")
        master_of = {a: slot_master(cluster, "ip:" + a) for a in addresses}
        victim = cluster.masters()[0].port
        requests = [(CLOSED, a, harness.environ(CLOSED, a)) for a in addresses]
        app = WSGIHandler()
        print(
            f"\n## One master of three: {args.fault}, {args.seconds:g} s under load "
            f"({THREADS} threads, a request every {PAUSE * 1000:g} ms each, {CLIENTS} clients, "
            "a fail-closed rule nobody reaches)\n"
        )
        with harness.Load(app, requests, THREADS, PAUSE) as load:
            load.at(1.0)
            with sick(cluster, victim, args.fault):
                began = load.now()
                time.sleep(args.seconds)
                ended = load.now()
        # The requests sent and answered while the master was sick.
        answers = [a for a in load.answers if began <= a.sent and a.received <= ended]
        rows = []
        for label, on_victim in (("the sick master", True), ("the two healthy masters", False)):
            theirs = [a for a in answers if (master_of[a.client] == victim) == on_victim]
            mine = [a.status for a in theirs]
            waits = [a.received - a.sent for a in theirs]
            slow = sum(1 for w in waits if w >= SETTINGS["TIMEOUT"])
            counts = Counter(mine)
            clients = sum(1 for a in addresses if (master_of[a] == victim) == on_victim)
            rows.append(
                (
                    label,
                    clients,
                    len(mine),
                    counts[200],
                    counts[503],
                    len(mine) - counts[200] - counts[503],
                    slow,
                    f"{max(waits) * 1000:.0f}",
                )
            )
        harness.table(
            ("clients of", "clients", "requests", "200", "503", "other", ">= TIMEOUT", "max ms"),
            rows,
        )
        if args.fault == "kill":
            cluster.wait_steady(replicas=True)
        print(
            "\n## One decision on the healthy cluster: deciding.decide() (the breakers, the fail "
            "modes) and the store's decide() alone (medians of 4000, µs)\n"
        )
        harness.table(("request", "path", "µs"), decide_cost(cluster))
    return 0


if __name__ == "__main__":
    sys.exit(main())
