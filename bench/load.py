"""The example project under gunicorn while Redis is killed or hung (docs/benchmarks.md, "Load")."""

from __future__ import annotations

import argparse
import http.client
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import harness
from harness import HOST

BREAKER_INTERVAL = 2.0
INTERVAL, CLOSED_EVERY, HANG_MS = 0.05, 5, 1000.0
CLIENTS, WORKERS, THREADS = 16, 3, 4  # client threads; gunicorn processes x gthread threads
LIMIT, MAX_REQUESTS = 20, 15_000  # per client and minute on /api/; a hard cap on the run

# BLOCK_CACHE off: the checks count what Redis and the local fallback decide; the block cache
# would answer a client over its limit from memory for the rest of its window, outage or not.
SETTINGS = """from example_project.settings import *  # noqa: F403

DEBUG = False
DATABASES["default"]["NAME"] = {db!r}  # noqa: F405
DJANGO_THROTTLE = {{
    **DJANGO_THROTTLE, "BREAKER_INTERVAL": {breaker}, "BLOCK_CACHE": False
}}  # noqa: F405
"""

RULES = """from django_throttle.models import Rule
Rule.objects.create(name="bench-api", scope="/api/", key_kind="header", key_arg="X-Client",
    limit={limit}, unit="minute", algorithm="sliding_window_log", fail_mode="open")
Rule.objects.create(name="bench-items", scope=r"^/items/\\d+/$", key_kind="header",
    key_arg="X-Client", limit=100000, unit="minute", algorithm="fixed_window", fail_mode="closed")
"""


@dataclass(slots=True)
class Sample:
    end: float  # seconds since the load started, when the answer arrived
    ms: float
    status: int  # -1: no HTTP answer
    client: int
    closed: bool  # the fail-closed path
    retry_after: bool


@dataclass
class Load:
    port: int
    clients: int
    max_requests: int
    t0: float
    deadline: float
    stop: threading.Event = field(default_factory=threading.Event)
    samples: list[Sample] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: int = 0

    def reconnects(self, client: int) -> bool:
        return client >= self.clients // 2

    def ticket(self) -> bool:
        with self.lock:
            self.sent += 1
            return self.sent <= self.max_requests


def client_loop(load: Load, client: int) -> None:
    headers = {"X-Client": f"c{client:02d}", "Accept": "application/json"}
    if load.reconnects(client):
        headers["Connection"] = "close"
    conn = http.client.HTTPConnection(HOST, load.port, timeout=10)
    next_at = load.t0 + INTERVAL * client / load.clients  # spread over one interval
    local: list[Sample] = []
    for n in range(10**6):
        now = time.perf_counter()
        if load.stop.is_set() or now >= load.deadline or not load.ticket():
            break
        time.sleep(max(0.0, next_at - now))
        next_at = max(next_at + INTERVAL, time.perf_counter() - INTERVAL)
        closed = n % CLOSED_EVERY == CLOSED_EVERY - 1
        started, status, retry = time.perf_counter(), -1, False
        try:
            conn.request(
                "GET", f"/items/{client + 1}/" if closed else "/api/items/", headers=headers
            )
            resp = conn.getresponse()
            resp.read()
            status, retry = resp.status, resp.getheader("Retry-After") is not None
            if resp.will_close:
                conn.close()
        except (OSError, http.client.HTTPException):
            conn.close()
        end = time.perf_counter()
        local.append(Sample(end - load.t0, (end - started) * 1000, status, client, closed, retry))
    conn.close()
    with load.lock:
        load.samples.extend(local)


def report(load: Load, bounds: dict[str, tuple[float, float]], fault: str) -> list[str]:
    """Print the tables; return the checks that failed."""
    rows, admitted, failures = [], {}, []
    count_503, count_200 = {}, {}
    for phase, (start, stop) in bounds.items():
        mine = [s for s in load.samples if start <= s.end < stop]
        for closed, label in ((False, "fail-open /api/"), (True, "fail-closed /items/")):
            sel = [s for s in mine if s.closed is closed]
            statuses = Counter("no answer" if s.status < 0 else str(s.status) for s in sel)
            ms = sorted(s.ms for s in sel if s.status > 0) or [float("nan")]
            bad = sum(
                s.status < 0 or s.status >= 500 and not (closed and s.status == 503) for s in sel
            )
            listed = ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())) or "-"
            rows.append(
                (
                    f"{phase} ({stop - start:.1f} s)",
                    label,
                    len(sel),
                    listed,
                    bad,
                    *(f"{x:.1f}" for x in (harness.median(ms), harness.p99(ms), ms[-1])),
                )
            )
            if bad:
                failures.append(
                    f"{phase}, {label}: {bad} answers 5xx (not a fail-closed 503) or none"
                )
            if ms[-1] > HANG_MS:
                failures.append(f"{phase}, {label}: a request took {ms[-1]:.0f} ms")
        count_503[phase] = sum(s.closed and s.status == 503 for s in mine)
        count_200[phase] = sum(s.closed and s.status == 200 for s in mine)
        if any(s.status in (429, 503) and not s.retry_after for s in mine):
            failures.append(f"{phase}: a 429 or 503 without Retry-After")
        admitted[phase] = [
            sum(s.client == c and not s.closed and s.status == 200 for s in mine)
            for c in range(load.clients)
        ]
    print("\n## Per phase (by the time the answer arrived; latency seen by the client)\n")
    harness.table(
        ("phase", "path", "requests", "statuses", "unexpected", "p50 ms", "p99 ms", "max ms"), rows
    )
    print(f"\n## Admitted per client on /api/ (limit {LIMIT}/minute)\n")
    half, joined = load.clients // 2, " ".join
    rows = [
        (p, joined(map(str, v[:half])), joined(map(str, v[half:]))) for p, v in admitted.items()
    ]
    harness.table(("phase", "keep-alive clients", "a new connection per request"), rows)

    # Killed: the new server is empty, a fresh window. Hung or up: the log of the first phase
    # is still there, within the minute: nothing more. While down, at most one limit per worker.
    want, slack = (LIMIT if fault == "kill" else 0), (0 if fault == "none" else WORKERS * LIMIT)
    if set(admitted["before"]) != {LIMIT}:
        failures.append(f"before: admitted {admitted['before']}, not {LIMIT} each")
    if max(admitted["outage"]) > slack:
        failures.append(f"outage: admitted {admitted['outage']}, more than {slack}")
    if not all(want <= n <= want + slack for n in admitted["after"]):
        failures.append(f"after: admitted {admitted['after']}, expected {want} each")
    if fault == "none" and count_503["outage"] + count_503["after"]:
        failures.append("503s without an outage")
    if fault != "none" and not (count_503["outage"] and count_200["after"]):
        failures.append(
            f"fail-closed path: {count_503['outage']} 503s down, {count_200['after']} 200s back"
        )
    late = [
        s.end - s.ms / 1000 - bounds["after"][0]
        for s in load.samples
        if s.closed and s.status == 503 and s.end >= bounds["after"][0]
    ]
    if fault != "none" and late and max(late) > BREAKER_INTERVAL + 1:
        failures.append(f"503s went on {max(late):.1f} s after Redis was back")
    print(
        f"\nLast 503 of the fail-closed path after Redis was back: {f'+{max(late):.2f} s' if late else 'none'}"
    )
    print("\n## Checks\n")
    print("\n".join(f"- FAILED: {f}" for f in failures) or "- all held")
    return failures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--fault", choices=("kill", "stop", "none"), default="kill")
    p.add_argument(
        "--phases",
        type=float,
        nargs=3,
        default=(8.0, 7.0, 8.0),
        metavar="S",
        help="seconds before, during and after the outage (8 7 8; the breaker's "
        "interval is added to the last)",
    )
    args = p.parse_args()
    before, outage, after = args.phases
    if before + outage + after + BREAKER_INTERVAL > 50:
        p.error("the phases must fit in the /api/ rule's one-minute window")
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))  # run the finally
    workdir = Path(tempfile.mkdtemp(prefix="bench-load-"))
    redis = harness.RedisServer()
    server: harness.Gunicorn | None = None
    load: Load | None = None
    try:
        harness.print_machine("gunicorn")
        redis.start()
        (workdir / "bench_load_settings.py").write_text(
            SETTINGS.format(db=str(workdir / "db.sqlite3"), breaker=BREAKER_INTERVAL)
        )
        env = harness.project_env(workdir, "bench_load_settings", redis.url)
        harness.manage(env, "migrate", "--noinput")
        harness.manage(env, "shell", "-c", RULES.format(limit=LIMIT))
        server = harness.Gunicorn(env, workdir / "gunicorn.log", WORKERS, THREADS)
        server.start()
        for i in range(WORKERS * 6):  # every worker loads its rules before the clock starts
            harness.http_get(server.port, "/api/items/" if i % 2 else "/items/1/")
        t0 = time.perf_counter()
        load = Load(server.port, CLIENTS, MAX_REQUESTS, t0, t0 + before + outage + after + 15)
        threads = [threading.Thread(target=client_loop, args=(load, c)) for c in range(CLIENTS)]
        for t in threads:
            t.start()

        def at(offset: float) -> float:
            time.sleep(max(0.0, t0 + offset - time.perf_counter()))
            return time.perf_counter() - t0

        down_at = at(before)
        {"kill": redis.kill, "stop": redis.pause, "none": lambda: None}[args.fault]()
        at(down_at + outage)
        {"kill": redis.start, "stop": redis.resume, "none": lambda: None}[args.fault]()
        back_at = time.perf_counter() - t0
        end_at = at(back_at + after + BREAKER_INTERVAL)
        load.stop.set()
        for t in threads:
            t.join(15)
        bounds = {"before": (0, down_at), "outage": (down_at, back_at), "after": (back_at, end_at)}
        server.stop()
        tracebacks = (workdir / "gunicorn.log").read_text(errors="replace").count("Traceback")
        print(
            f"\nfault: {args.fault}; {CLIENTS} clients (one request per {INTERVAL * 1000:g} ms "
            f"each, half on keep-alive), gunicorn {WORKERS} x {THREADS} gthread; "
            f"{len(load.samples)} requests; down at {down_at:.1f} s, back at {back_at:.1f} s, end "
            f"{end_at:.1f} s; tracebacks in the server log: {tracebacks}"
        )
        failures = report(load, bounds, args.fault)
        return 1 if failures or tracebacks else 0
    finally:
        if load is not None:
            load.stop.set()
        if server is not None:
            server.stop()
        redis.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
