"""Decisions on one node, a primary with a replica and a cluster; failovers (docs/benchmarks.md,
"Production topologies")."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import harness
from harness import Case
from topologies import Cluster, ReplicatedRedis, SentinelGroup, TcpProxy

SECTIONS = ("latency", "throughput", "spread", "faults")
DATABASE = "file:bench-topology?mode=memory&cache=shared"  # every thread sees the tables

N_CLIENTS = 1000
RATES = ((10**6, "hour"), (10**5, "minute"), (10**7, "day"), (10**4, "second"), (10**9, "day"))
IP = ("ip", "")
SCOPES = {  # scope: (key kind, key argument) of each rule, all fixed window
    "r1": [IP],
    "r3": [IP] * 3,
    "r5": [IP] * 5,
    "mixed": [IP, ("header", "X-Client"), ("param", "key")],
}
LABELS = {"r1": "1 rule", "r3": "3 rules", "r5": "5 rules", "mixed": "3 rules, 3 identities"}
SINGLE, REPLICATED, CLUSTER = "single node", "primary + replica", "cluster"

THREADS, THROUGHPUT_SCOPES = 8, ("r1", "mixed")
SPREAD_CLIENTS, SPREAD_TARGET = 10_000, 1.15

FAULT_SETTINGS = {
    "TIMEOUT": 0.1,
    "CONNECT_TIMEOUT": 0.1,
    "BREAKER_INTERVAL": 1.0,
    "RULES_REFRESH": 3600.0,
}
OPEN, CLOSED, EXACT = "/open/", "/closed/", "/exact/"
PATH_RULES = (  # path, limit per hour, fail mode
    (OPEN, 10**9, "open"),
    (CLOSED, 10**9, "closed"),
    (EXACT, 5, "closed"),
)
LOAD_THREADS, LOAD_CLIENTS, LOAD_PAUSE = 4, 256, 0.002
UNAVAILABLE_LOG = "django_throttle: the store is unavailable"

ADDRESSES = harness.addresses(SPREAD_CLIENTS)
urlpatterns: list[Any] = []  # this module is the ROOT_URLCONF; filled in by urls()


# -- set-up -----------------------------------------------------------------------------------


def urls() -> None:
    from django.urls import path

    plain = harness.plain_view()
    urlpatterns[:] = [path(p.strip("/") + "/", plain) for p, _, _ in PATH_RULES]


def create_rules() -> None:
    from django_throttle.models import Rule

    for scope, kinds in SCOPES.items():
        for n, (kind, arg) in enumerate(kinds):
            limit, unit = RATES[n]
            Rule.objects.create(
                name=f"{scope}-{n}",
                scope=scope,
                key_kind=kind,
                key_arg=arg,
                limit=limit,
                unit=unit,
                algorithm="fixed_window",
            )
    for path, limit, mode in PATH_RULES:
        Rule.objects.create(
            name=path.strip("/"),
            scope=path,
            limit=limit,
            unit="hour",
            algorithm="fixed_window",
            fail_mode=mode,
        )


def pin(pids: Sequence[int], cpus: str) -> None:
    """Every thread of these processes on ``cpus`` (``taskset -a``: redis-server's background
    threads too, as ``taskset -c`` at its start would)."""
    for pid in pids:
        subprocess.run(
            ["taskset", "-a", "-p", "-c", cpus, str(pid)], check=True, capture_output=True
        )


def all_cpus() -> str:
    return f"0-{(os.cpu_count() or 1) - 1}"


def request(n: int) -> Any:
    """A fresh request of client ``n``: its address, X-Client header and ``key`` parameter."""
    from django.http import HttpRequest, QueryDict

    r = HttpRequest()
    r.method, r.path = "GET", "/api/"
    r.META["REMOTE_ADDR"] = ADDRESSES[n]
    r.META["HTTP_X_CLIENT"] = f"h{n}"
    r.GET = QueryDict(f"key=p{n}")
    return r


def build_stores(primary_url: str, cluster_url: str) -> dict[str, Any]:
    """The stores, each as get_store() builds it: on the cache's server (the single node, then
    a primary with a replica), and with CLUSTER_URL."""
    from django.conf import settings
    from django.test import override_settings

    from django_throttle.store.guarded import build_backend

    single = build_backend()
    with override_settings(CACHES={"default": cache_at(primary_url)}):
        replicated = build_backend()
    with override_settings(
        DJANGO_THROTTLE={**settings.DJANGO_THROTTLE, "CLUSTER_URL": cluster_url}
    ):
        cluster = build_backend()
    return {SINGLE: single, REPLICATED: replicated, CLUSTER: cluster}


def cache_at(url: str) -> dict[str, Any]:
    return {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}


def install(store: Any) -> None:
    """The backend get_store() decides on from now on (None: the one the settings make)."""
    from django_throttle.store import get_store

    get_store().use(store)


def close_stores(stores: dict[str, Any]) -> None:
    install(None)
    for store in stores.values():
        store.close()
    stores.clear()


def deciding(scope: str) -> Callable[[Any], None]:
    from django_throttle import check

    def op(r: Any) -> None:
        if not check(r, scope).allowed:
            raise RuntimeError(f"a decision under {scope} was not admitted")

    return op


# -- latency ----------------------------------------------------------------------------------


def raw_in_turn(urls: Sequence[str]) -> Case:
    """The reference on the cluster: redis-py's EVALSHA of ``return 1`` to each master in turn
    (with every node on one CPU, switching between servers costs time of its own)."""
    import redis

    clients = [redis.Redis.from_url(url, socket_timeout=1.0) for url in urls]
    sha = [client.script_load("return 1") for client in clients][0]
    return Case("raw EVALSHA in turn", lambda i: clients[i % len(clients)].evalsha(sha, 0))


RAW = "raw EVALSHA `return 1` (redis-py)"


def latency_cases(
    stores: dict[str, Any], raw_url: str, master_urls: Sequence[str]
) -> list[tuple[str, str, Case]]:
    """(rules, topology, case) each; the raw EVALSHA first."""

    def prep(store: Any) -> Callable[[int], Any]:
        def fresh(i: int) -> Any:
            install(store)  # untimed: interleaved() times op alone
            return request(i % N_CLIENTS)

        return fresh

    cases = [
        (RAW, SINGLE, harness.raw_evalsha(raw_url)),
        (RAW, f"{CLUSTER} ({len(master_urls)} masters in turn)", raw_in_turn(master_urls)),
    ]
    for scope, label in LABELS.items():
        for topology, store in stores.items():
            cases.append(
                (label, topology, Case(f"{label}, {topology}", deciding(scope), prep(store)))
            )
    return cases


def masters_touched(cluster_store: Any) -> Counter[int]:
    """How many masters the mixed rules of each client reach (one EVALSHA per slot)."""
    from django_throttle.state_keys import client_tag
    from django_throttle.store.cluster import slot_of_tag

    nodes = cluster_store.client.nodes_manager
    touched: Counter[int] = Counter()
    for n in range(N_CLIENTS):
        identities = (f"ip:{ADDRESSES[n]}", f"header:h{n}", f"param:p{n}")
        slots = {slot_of_tag(client_tag(who)) for who in identities}
        touched[len({nodes.get_node_from_slot(s).port for s in slots})] += 1
    return touched


def report_latency(cases: list[tuple[str, str, Case]], touched: Counter[int]) -> None:
    raw = cases[0][2].median_us
    singles = {label: c.median_us for label, topology, c in cases if topology == SINGLE}
    rows = []
    for label, topology, c in cases:
        versus = f"{c.median_us / singles[label]:.2f}x" if topology != SINGLE else "-"
        rows.append(
            (
                label,
                topology,
                f"{c.median_us:.1f}",
                f"{c.p99_us:.1f}",
                f"{c.median_us / raw:.2f}x",
                versus,
            )
        )
    harness.table(
        ("rules", "topology", "median µs", "p99 µs", "/ raw EVALSHA", "/ single node"), rows
    )
    spread = ", ".join(f"{k}: {touched[k] / N_CLIENTS:.0%}" for k in sorted(touched))
    print(
        f"\n3 rules, 3 identities: 3 slots per request on the cluster (3 EVALSHAs at once); "
        f"masters reached per request ({N_CLIENTS} clients): {spread}"
    )


# -- throughput -------------------------------------------------------------------------------


def hammer(scope: str, seconds: float, threads: int) -> tuple[int, float]:
    """``threads`` threads calling check() for ``seconds``: (decisions, seconds elapsed)."""
    op = deciding(scope)
    go, stop = threading.Event(), threading.Event()
    counts: list[int] = []
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        i, n = k * (N_CLIENTS // threads), 0
        go.wait()
        try:
            while not stop.is_set():
                op(request(i % N_CLIENTS))
                i += 1
                n += 1
        except BaseException as exc:
            errors.append(exc)
        counts.append(n)

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    started = time.perf_counter()
    go.set()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return sum(counts), elapsed


def throughput(stores: dict[str, Any], seconds: float, slices: int) -> list[tuple[str, ...]]:
    totals = {(s, t): [0, 0.0] for s in THROUGHPUT_SCOPES for t in stores}
    for _ in range(slices):
        for scope in THROUGHPUT_SCOPES:
            for topology, store in stores.items():
                install(store)
                n, elapsed = hammer(scope, seconds / slices, THREADS)
                totals[scope, topology][0] += n
                totals[scope, topology][1] += elapsed
    rows = []
    for (scope, topology), (n, elapsed) in totals.items():
        rate = n / elapsed
        single = totals[scope, SINGLE][0] / totals[scope, SINGLE][1]
        versus = f"{rate / single:.2f}x" if topology != SINGLE else "-"
        rows.append((LABELS[scope], topology, str(n), f"{elapsed:.1f}", f"{rate:.0f}", versus))
    return rows


# -- key spread -------------------------------------------------------------------------------


def spread(cluster: Cluster, store: Any) -> tuple[list[tuple[str, ...]], float]:
    """Keys per master after SPREAD_CLIENTS clients decided once each; and max / mean."""
    cluster.flushall()
    install(store)
    op = deciding("r1")
    for n in range(SPREAD_CLIENTS):
        op(request(n))
    sizes = cluster.keys_per_master()
    mean = sum(sizes.values()) / len(sizes)
    rows = [(f"127.0.0.1:{port}", str(n), f"{n / mean:.3f}x") for port, n in sizes.items()]
    rows.append(("total", str(sum(sizes.values())), "-"))
    return rows, max(sizes.values()) / mean


# -- faults under load ------------------------------------------------------------------------


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def captured_logs() -> Iterator[Captured]:
    """django_throttle's log and Django's request log (500s), kept instead of printed."""
    handler = Captured()
    loggers = [logging.getLogger(name) for name in ("django_throttle", "django.request")]
    saved = [logger.propagate for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield handler
    finally:
        for logger, propagate in zip(loggers, saved, strict=True):
            logger.removeHandler(handler)
            logger.propagate = propagate


@dataclass
class Fault:
    name: str
    act: Callable[[], str]  # the fault; returns once a writable primary is reachable, and a note
    caches: dict[str, Any] | None = None  # CACHES["default"], if not the single node's
    cluster_url: str | None = None
    settle: Callable[[], None] | None = None  # waits until the topology is steady again
    victims: set[str] = field(default_factory=set)  # clients whose slot was on a killed master


@dataclass
class FaultRun:
    fault: Fault
    answers: list[harness.Answer]
    errors: list[BaseException]
    fault_at: float
    reachable_at: float
    settled_at: float
    end_at: float
    exact: list[int]
    logs: list[logging.LogRecord]
    note: str


def run_fault(fault: Fault, before: float, after: float, exact_client: str) -> FaultRun:
    from django.conf import settings
    from django.core.handlers.wsgi import WSGIHandler
    from django.test import override_settings

    throttle = {**settings.DJANGO_THROTTLE, **FAULT_SETTINGS}
    if fault.cluster_url:
        throttle["CLUSTER_URL"] = fault.cluster_url
    overrides: dict[str, Any] = {"DJANGO_THROTTLE": throttle}
    if fault.caches:
        overrides["CACHES"] = {"default": fault.caches}
    # The settings' change rebuilds the store and the rule cache (django_throttle's receiver).
    with override_settings(**overrides), captured_logs() as logs:
        app = WSGIHandler()
        warm = [harness.get(app, harness.environ(p, "192.0.2.1"))[0] for p in (OPEN, CLOSED)]
        if warm != [200, 200]:  # the rules are loaded, the script too
            raise RuntimeError(f"{fault.name}: warm-up answered {warm}")
        addresses = harness.addresses(LOAD_CLIENTS, prefix="198.19")
        requests = [(p, a, harness.environ(p, a)) for a in addresses for p in (OPEN, CLOSED)]
        with harness.Load(app, requests, LOAD_THREADS, LOAD_PAUSE) as load:
            fault_at = load.at(before)
            note = fault.act()
            reachable_at = load.now()
            if fault.settle is not None:
                fault.settle()
            settled_at = load.now()
            end_at = load.at(settled_at + after)
        exact = [harness.get(app, harness.environ(EXACT, exact_client))[0] for _ in range(6)]
    return FaultRun(
        fault,
        load.answers,
        load.errors,
        fault_at,
        reachable_at,
        settled_at,
        end_at,
        exact,
        logs.records,
        note,
    )


def wait_demoted(port: int, timeout: float = 30.0) -> None:
    """Until the server on ``port`` is a replica (Sentinel kills its clients as it demotes it)."""
    import redis

    deadline = time.monotonic() + timeout
    with contextlib.closing(redis.Redis(port=port, socket_timeout=1.0)) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                if client.execute_command("ROLE")[0] == b"slave":
                    return
            time.sleep(0.02)
    raise TimeoutError(f"the old master :{port} was not demoted within {timeout} s")


def faults(cluster: Cluster, before: float, after: float) -> list[FaultRun]:
    from django_throttle.state_keys import client_tag
    from django_throttle.store.cluster import slot_of_tag

    runs = []
    with ReplicatedRedis() as pair, TcpProxy(pair.primary.port) as proxy:

        def switchover() -> str:
            old = pair.primary.port
            pair.switchover()
            proxy.switch(pair.primary.port)
            took = pair.last_switchover_seconds or 0.0
            return f"switchover() {took:.2f} s, proxy from :{old} to :{pair.primary.port}"

        fault = Fault("(a) switchover behind a proxy", switchover, caches=cache_at(proxy.url))
        runs.append(run_fault(fault, before, after, "192.0.2.11"))

    with SentinelGroup(service_name="mymaster") as group:
        old_master: list[int] = []

        def failover() -> str:
            old = group.master_address()[1]
            old_master.append(old)
            new = group.failover()[1]
            took = group.last_failover_seconds or 0.0
            return f"failover() {took:.2f} s, master from :{old} to :{new}"

        def demoted() -> None:
            wait_demoted(old_master[0])

        sentinel = {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{group.service_name}/0",
            "OPTIONS": {
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": group.sentinels,
            },
        }
        fault = Fault("(b) Sentinel failover()", failover, caches=sentinel, settle=demoted)
        runs.append(run_fault(fault, before, after, "192.0.2.12"))

    url = cluster.url
    victim = cluster.masters()[0].port
    addresses = harness.addresses(LOAD_CLIENTS, prefix="198.19")
    victims = {
        a for a in addresses if cluster.node_for_slot(slot_of_tag(client_tag(f"ip:{a}"))) == victim
    }

    def kill() -> str:
        port = cluster.kill_master(victim)
        took = cluster.last_failover_seconds or 0.0
        role = "the CLUSTER_URL node" if url.endswith(f":{port}/0") else "not the CLUSTER_URL node"
        return f"kill_master() {took:.2f} s, killed :{port} ({role}), masters now " + ", ".join(
            f":{m.port}" for m in cluster.masters()
        )

    fault = Fault("(c) cluster kill_master()", kill, cluster_url=url, victims=victims)
    runs.append(run_fault(fault, before, after, "192.0.2.13"))
    return runs


def statuses(answers: Sequence[harness.Answer]) -> str:
    counts = Counter("none" if a.status < 0 else str(a.status) for a in answers)
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "-"


def summary(run: FaultRun) -> tuple[tuple[str, ...], list[str]]:
    """A fault's row of the table, and the checks that failed."""
    name, answers = run.fault.name, run.answers
    closed = [a for a in answers if a.path == CLOSED]
    opened = [a for a in answers if a.path == OPEN]
    bad = [a for a in answers if a.status < 0 or a.status >= 500 and a.status != 503]
    open_503 = [a for a in opened if a.status == 503]
    unavailable = [a for a in closed if a.status == 503]
    bare = [a for a in unavailable if not a.retry_after]
    recovered = next((a for a in closed if a.sent >= run.reachable_at and a.status == 200), None)
    recovery = None if recovered is None else recovered.received - run.reachable_at
    window = unavailable[-1].received - unavailable[0].sent if unavailable else 0.0
    exact = run.exact == [200] * 5 + [429]
    row = (
        name,
        str(len(answers)),
        statuses(opened),
        statuses(closed),
        str(len(bad)),
        str(len(bare)),
        f"{window:.2f}",
        "never" if recovery is None else f"{recovery:.2f}",
        "yes" if exact else "no: " + " ".join(map(str, run.exact)),
    )
    failures = []
    if bad:
        failures.append(f"{name}: {len(bad)} answers 5xx (not 503) or none")
    if open_503:
        failures.append(f"{name}: {len(open_503)} 503s on the fail-open path")
    if bare:
        failures.append(f"{name}: {len(bare)} 503s without Retry-After")
    if recovery is None:
        failures.append(f"{name}: no 200 on {CLOSED} after the primary was reachable")
    if not exact:
        failures.append(f"{name}: {EXACT} answered {run.exact}, not 5 x 200 then 429")
    return row, failures


def report_faults(runs: list[FaultRun]) -> list[str]:
    """Print the table and the notes; return the checks that failed."""
    summaries = [summary(run) for run in runs]
    print("\n## Faults under load\n")
    header = ("fault", "requests", f"{OPEN} (fail-open)", f"{CLOSED} (fail-closed)", "500s")
    header += ("503 without Retry-After", "503 window s", "recovery s", f"exact after ({EXACT})")
    harness.table(header, [row for row, _ in summaries])
    print()
    for run in runs:
        print(f"- {run.fault.name}: {fault_notes(run)}")
    return [failure for _, failures in summaries for failure in failures]


def fault_notes(run: FaultRun) -> str:
    """What happened, from the fault's own note, the load and the captured log."""
    opened = sum(r.getMessage().startswith(UNAVAILABLE_LOG) for r in run.logs)
    notes = [
        f"{run.note}; load {run.end_at:.1f} s, fault at {run.fault_at:.1f} s, writable "
        f"{run.reachable_at - run.fault_at:.2f} s after it",
        f"breaker opened {opened} time{'s' * (opened != 1)}",
    ]
    if run.fault.settle is not None:
        notes.append(f"old master demoted {run.settled_at - run.fault_at:.2f} s after the fault")
    if run.fault.victims:
        unavailable = [a for a in run.answers if a.path == CLOSED and a.status == 503]
        others = sum(a.client not in run.fault.victims for a in unavailable)
        notes.append(
            f"{len(run.fault.victims)}/{LOAD_CLIENTS} clients had their slot on the killed "
            f"master; {others} of the {len(unavailable)} 503s went to the others"
        )
    if run.errors:
        notes.append(f"{len(run.errors)} exceptions in the client threads: {run.errors[0]!r}")
    tracebacks = [r for r in run.logs if r.exc_info]
    if tracebacks:
        first = tracebacks[0].exc_info
        assert first is not None
        notes.append(f"{len(tracebacks)} logged tracebacks, the first: {first[1]!r}")
    messages = Counter(r.getMessage()[:160] for r in run.logs if r.name == "django_throttle")
    logged = "; ".join(f"{n} x {m!r}" for m, n in messages.most_common(4))
    notes.append(f"log: {logged or 'nothing'}")
    return "; ".join(notes)


# -- main -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short run, for a smoke check")
    parser.add_argument("--only", choices=SECTIONS, help="run this part alone")
    args = parser.parse_args()
    sections = (args.only,) if args.only else SECTIONS
    rounds, per_round = (2, 300) if args.quick else (5, 2000)
    busy, slices = (1.0, 2) if args.quick else (3.0, 6)
    before, after = (1.0, 2.0) if args.quick else (2.0, 5.0)
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))  # run the finally
    started = time.monotonic()
    failures: list[str] = []
    stores: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        single = stack.enter_context(harness.RedisServer())
        cluster = stack.enter_context(Cluster())
        pair = stack.enter_context(ReplicatedRedis())
        stack.callback(close_stores, stores)  # first: before the servers stop
        harness.configure_throttled(single.url, __name__, DATABASE)
        urls()
        create_rules()
        harness.print_machine("django-redis")
        print(
            f"\nTopologies: one redis-server; a primary with a replica (replicaof); a cluster of "
            f"{len(cluster.masters())} masters with a replica each (CLUSTER_URL {cluster.url}). "
            "The cache is on the single node but for the primary with a replica (and the faults)."
        )
        stores.update(build_stores(pair.primary.url, cluster.url))
        assert single.proc is not None
        nodes = (pair.primary, pair.replica, *cluster.nodes)
        pids = [single.proc.pid, *(n.pid for n in nodes if n is not None and n.pid)]
        if "latency" in sections:
            harness.pin_client(harness.CPU)
            pin(pids, "0")
            masters = [m.url for m in cluster.masters()]
            cases = latency_cases(stores, single.url, masters)
            print(
                f"\n## Latency of check() ({rounds} x {per_round} calls per case, {N_CLIENTS} "
                f"clients, this process and all {len(pids)} redis-servers on CPU 0)\n",
                flush=True,
            )
            harness.interleaved([c for _, _, c in cases], rounds, per_round, warmup=N_CLIENTS)
            report_latency(cases, masters_touched(stores[CLUSTER]))
            harness.unpin_client()
            pin(pids, all_cpus())
        if "throughput" in sections:
            print(
                f"\n## Throughput: {THREADS} threads calling check(), {busy:g} s per case in "
                f"{slices} slices taking turns, nothing pinned ({os.cpu_count()} CPUs)\n",
                flush=True,
            )
            harness.table(
                ("rules", "topology", "decisions", "seconds", "per second", "/ single node"),
                throughput(stores, busy, slices),
            )
        if "spread" in sections:
            print(
                f"\n## Key spread: {SPREAD_CLIENTS} clients decided once each on the cluster, "
                "1 rule (DBSIZE per master)\n",
                flush=True,
            )
            rows, ratio = spread(cluster, stores[CLUSTER])
            harness.table(("master", "keys", "/ mean"), rows)
            verdict = "met" if ratio <= SPREAD_TARGET else "MISSED"
            print(f"\nmax / mean {ratio:.3f}x (target at most {SPREAD_TARGET}x: {verdict})")
            if ratio > SPREAD_TARGET:
                failures.append(f"spread: max / mean {ratio:.3f}x")
        close_stores(stores)  # the faults build theirs from their settings
        if "faults" in sections:
            settings = ", ".join(f"{k} {v:g}" for k, v in FAULT_SETTINGS.items())
            print(
                f"\nFaults: {LOAD_THREADS} threads, a request every {LOAD_PAUSE * 1000:g} ms "
                f"each, {LOAD_CLIENTS} clients; {settings}; the fault after {before:g} s, the "
                f"load {after:g} s more once a writable primary is reachable (for Sentinel: "
                "once the old master is demoted).",
                flush=True,
            )
            failures += report_faults(faults(cluster, before, after))
    print("\n## Checks\n")
    print("\n".join(f"- FAILED: {f}" for f in failures) or "- all held")
    print(f"\nRun time {time.monotonic() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
