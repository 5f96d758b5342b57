"""The example project under gunicorn while Redis is killed or hung (docs/benchmarks.md, "Load");
with --faults, under gunicorn and uvicorn through failovers, slot migrations, hangs, a SCRIPT
FLUSH and 1,000 WebSockets (docs/benchmarks.md, "Load under faults")."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import HOST

from tests.redis_topology import ClusterHarness, SentinelGroup, admin

BREAKER_INTERVAL = 2.0
INTERVAL, CLOSED_EVERY, HANG_MS = 0.05, 5, 1000.0
CLIENTS, WORKERS, THREADS = 16, 3, 4  # client threads; gunicorn processes x gthread threads
LIMIT, MAX_REQUESTS = 20, 15_000  # per client and minute on /api/; a hard cap on the run

# BLOCK_CACHE off: the checks count what Redis and the local fallback decide; the block cache
# would answer a client over its limit from memory for the rest of its window, outage or not.
SETTINGS = """from example_project.settings import *  # noqa: F403

DEBUG = False
DATABASES["default"]["NAME"] = {db!r}  # noqa: F405
CACHES = {{"default": {cache!r}}}
DJANGO_THROTTLE = {{
    **DJANGO_THROTTLE, "BREAKER_INTERVAL": {breaker}, "BLOCK_CACHE": False, **{extra!r}
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
    interval: float = INTERVAL  # each client's pause between requests
    every: int = CLOSED_EVERY  # every n-th request goes to /items/
    prefix: str = "c"  # of the X-Client header: the clients of each run their own
    threads: list[threading.Thread] = field(default_factory=list)

    def ticket(self) -> bool:
        with self.lock:
            self.sent += 1
            return self.sent <= self.max_requests

    def start(self) -> None:
        """A thread per client, each running client_loop()."""
        for client in range(self.clients):
            self.threads.append(threading.Thread(target=client_loop, args=(self, client)))
            self.threads[-1].start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(15)


def project(workdir: Path, module: str, redis_url: str, rules: str, **conf: Any) -> dict[str, str]:
    """The example project's settings ``module`` in ``workdir`` (its cache ``conf["CACHES"]``,
    else Redis at ``redis_url``; the rest of ``conf`` into DJANGO_THROTTLE), its database made
    with ``rules`` the first time; the environment of its commands and servers."""
    db, cache = workdir / "db.sqlite3", {"BACKEND": "django_redis.cache.RedisCache"}
    cache = conf.pop("CACHES", {**cache, "LOCATION": redis_url})
    (workdir / f"{module}.py").write_text(
        SETTINGS.format(db=str(db), cache=cache, breaker=BREAKER_INTERVAL, extra=conf)
    )
    # The caller's DJANGO_, REDIS_ and DEMO_ variables left out.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "REDIS_", "DEMO_"))}
    path = os.pathsep.join([str(workdir), harness.ROOT])
    env.update(DJANGO_SETTINGS_MODULE=module, PYTHONPATH=path, REDIS_URL=redis_url)
    for command in [] if db.exists() else [["migrate", "--noinput"], ["shell", "-c", rules]]:
        manage = [sys.executable, "manage.py", *command]
        subprocess.run(
            manage, cwd=harness.ROOT, env=env, check=True, capture_output=True, timeout=120
        )
    return env


def serve(cls: type[harness.Gunicorn], env: dict[str, str], log: Path) -> harness.Gunicorn:
    """The example project under ``cls``, every worker with its rules loaded."""
    server = cls(env, log, WORKERS, THREADS)
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    for i in range(WORKERS * 6):  # every worker loads its rules before the clock starts
        harness.http_get(server.port, "/api/items/" if i % 2 else "/items/1/")
    return server


def client_loop(load: Load, client: int) -> None:
    headers = {"X-Client": f"{load.prefix}{client:02d}", "Accept": "application/json"}
    if client >= load.clients // 2:  # the second half: a new connection per request
        headers["Connection"] = "close"
    conn = http.client.HTTPConnection(HOST, load.port, timeout=10)
    next_at = load.t0 + load.interval * client / load.clients  # spread over one interval
    local: list[Sample] = []
    for n in range(10**6):
        now = time.perf_counter()
        if load.stop.is_set() or now >= load.deadline or not load.ticket():
            break
        time.sleep(max(0.0, next_at - now))
        next_at = max(next_at + load.interval, time.perf_counter() - load.interval)
        closed = n % load.every == load.every - 1
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
    rows, admitted, failures, count_503, count_200 = [], {}, [], {}, {}
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
            latency = (f"{x:.1f}" for x in (harness.median(ms), harness.p99(ms), ms[-1]))
            rows.append((f"{phase} ({stop - start:.1f} s)", label, len(sel), listed, bad, *latency))
            if bad:
                why = "answers 5xx (not a fail-closed 503) or none"
                failures.append(f"{phase}, {label}: {bad} {why}")
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
    header = ("phase", "path", "requests", "statuses", "unexpected", "p50 ms", "p99 ms", "max ms")
    harness.table(header, rows)
    print(f"\n## Admitted per client on /api/ (limit {LIMIT}/minute)\n")
    half = load.clients // 2
    rows = [
        (p, *(" ".join(map(str, a)) for a in (v[:half], v[half:]))) for p, v in admitted.items()
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
    last = f"+{max(late):.2f} s" if late else "none"
    print(f"\nLast 503 of the fail-closed path after Redis was back: {last}")
    print("\n## Checks\n")
    print("\n".join(f"- FAILED: {f}" for f in failures) or "- all held")
    return failures


# --faults (docs/benchmarks.md, "Load under faults")
SUITE_LIMIT, SUITE_WINDOW = 3, 1.0  # per client and second on /api/: "admitted over N"
SUITE_CLIENTS, SUITE_INTERVAL, SUITE_EVERY = 16, 0.1, 2  # 160 requests/s, half to /items/
WS_CLIENTS, WS_TIMEOUT = 1000, 5.0
SERVERS = ("gunicorn", "uvicorn")
CLOSED = "closed 4429"  # by ThrottledConsumerMixin after 10 frames rejected: no error of its own

# Every rule fail-closed and keyed on X-Client: an unavailable store shows as a 503, never as
# an admission of a process's own memory. Only /api/ is ever over its limit.
SUITE_RULES = """from django_throttle.models import Rule
kw = dict(key_kind="header", key_arg="X-Client", fail_mode="closed")
Rule.objects.create(name="counted", scope="/api/", limit={limit}, unit="second",
    algorithm="sliding_window_log", **kw)
Rule.objects.create(name="free", scope=r"^/items/\\d+/$", limit=10**6, unit="minute",
    algorithm="fixed_window", **kw)
Rule.objects.create(name="echo", scope="echo", limit=10**6, unit="minute",
    algorithm="fixed_window", **kw)
"""


def stop(seconds: float) -> Callable[[Any, int, float], str | None]:
    def inject(redis: harness.RedisServer, port: int, until: float) -> None:
        redis.pause()
        time.sleep(seconds)
        redis.resume()

    return inject


def script_flush(redis: harness.RedisServer, port: int, until: float) -> None:
    with admin(redis.port) as client:
        client.script_flush()


def sentinel_failover(group: SentinelGroup, port: int, until: float) -> None:
    group.failover()


def cluster_failover(cluster: ClusterHarness, port: int, until: float) -> None:
    """CLUSTER FAILOVER on the replica of the first master; until every node agrees."""
    master = cluster.masters()[0].port
    for node in cluster.alive:
        with admin(node.port) as client:
            if client.info("replication").get("master_port") == master:
                client.execute_command("CLUSTER", "FAILOVER")
    cluster.wait_steady(without=master)


def migrate_slots(cluster: ClusterHarness, port: int, until: float) -> str:
    """Every slot holding a key on the first master moved to the second, one by one, with
    CLUSTER SETSLOT and MIGRATE, as redis-cli --cluster reshard moves them."""
    source, target, *others = cluster.masters()
    with admin(source.port) as src, admin(target.port) as dst:
        ids = [c.execute_command("CLUSTER", "MYID") for c in (src, dst)]
        slots = sorted({int(src.cluster("KEYSLOT", k)) for k in src.scan_iter(count=1000)})
        if not slots:
            raise RuntimeError("no key on the first master")
        for slot in slots[:200]:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[0])
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[1])
            for _ in range(100):
                keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
                if not keys:
                    break
                src.execute_command("MIGRATE", HOST, target.port, "", 0, 5000, "KEYS", *keys)
            for node in (target, source, *others):
                with admin(node.port) as client:
                    client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[1])
    cluster.wait_steady()
    return f"{len(slots[:200])} slots moved"


def websockets(redis: harness.RedisServer, port: int, until: float) -> None:
    """WS_CLIENTS WebSocket clients in a process of their own until ``until``."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    deadline = time.time() + until - time.perf_counter()  # the child's clock
    child = context.Process(target=ws_process, args=(port, deadline, theirs))
    child.start()
    theirs.close()
    if not ours.poll(until - time.perf_counter() + 60):
        child.kill()
    WS_RESULT[:] = [ours.recv()]  # EOFError when the child died: the fault failed
    child.join(30)


WS_RESULT: list[tuple[dict[str, int], list[float]]] = []


def ws_process(port: int, deadline: float, conn: Any) -> None:
    conn.send(asyncio.run(ws_clients(port, deadline)))


async def ws_clients(port: int, deadline: float) -> tuple[dict[str, int], list[float]]:
    """Each client connects (over the first second), then sends one text frame a second and
    waits for its echo; the counts of each outcome and the echoes' latency in ms."""
    from wsproto import ConnectionState, ConnectionType, WSConnection, events

    stats: Counter[str] = Counter()
    latency: list[float] = []

    async def client(k: int) -> None:
        await asyncio.sleep(k / WS_CLIENTS)
        ws, pending = WSConnection(ConnectionType.CLIENT), deque[Any]()
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
        except OSError:
            stats["no connection"] += 1
            return

        async def event() -> Any:
            while not pending:
                data = await reader.read(65536)
                ws.receive_data(data or None)
                for e in ws.events():
                    if isinstance(e, events.Ping):
                        writer.write(ws.send(e.response()))
                    else:
                        pending.append(e)
                if not data and not pending:
                    return None
            return pending.popleft()

        head = [(b"x-client", f"ws{k}".encode())]
        try:
            writer.write(ws.send(events.Request(host=HOST, target="/ws/echo/", extra_headers=head)))
            answer = await asyncio.wait_for(event(), WS_TIMEOUT)
            if not isinstance(answer, events.AcceptConnection):
                stats[f"handshake {getattr(answer, 'status_code', 'closed')}"] += 1
                return
            next_at = time.time() + k / WS_CLIENTS
            while next_at < deadline:
                await asyncio.sleep(max(0.0, next_at - time.time()))
                if ws.state is not ConnectionState.OPEN:  # the server's close is pending
                    answer = pending.popleft() if pending else None
                    break
                next_at, sent = next_at + 1.0, time.time()
                writer.write(ws.send(events.Message(data=f"m{k}")))
                answer = await asyncio.wait_for(event(), WS_TIMEOUT)
                if not isinstance(answer, events.TextMessage):
                    break
                stats["throttled" if "throttled" in answer.data else "echoed"] += 1
                latency.append((time.time() - sent) * 1000)
            else:
                return
            code = answer.code if isinstance(answer, events.CloseConnection) else "without a frame"
            stats[f"closed {code}"] += 1  # 4429: after throttle_close_after rejections
        except (OSError, TimeoutError):
            stats["unanswered"] += 1
        except Exception as exc:  # wsproto's protocol errors: counted, the others go on
            stats[type(exc).__name__] += 1
        finally:
            writer.close()

    await asyncio.gather(*(client(k) for k in range(WS_CLIENTS)))
    return dict(stats), latency


@dataclass(frozen=True)
class Fault:
    label: str
    topology: str  # single, sentinel or cluster
    inject: Callable[[Any, int, float], str | None]
    outage: bool = False  # Redis unreachable for more than TIMEOUT: 503s follow the fail mode
    minimum: float = 5.0  # seconds of load at least
    servers: tuple[str, ...] = SERVERS


FAULTS = {
    "stop-0.05": Fault("SIGSTOP 0.05 s", "single", stop(0.05)),
    "stop-1": Fault("SIGSTOP 1 s", "single", stop(1.0), outage=True),
    "flush": Fault("SCRIPT FLUSH", "single", script_flush),
    "ws": Fault(
        f"{WS_CLIENTS} WebSockets", "single", websockets, minimum=10.0, servers=("uvicorn",)
    ),
    "sentinel": Fault("Sentinel failover", "sentinel", sentinel_failover, minimum=20.0),
    "cluster-failover": Fault("CLUSTER FAILOVER", "cluster", cluster_failover),
    "migration": Fault("slot migration", "cluster", migrate_slots),
}


@contextlib.contextmanager
def topology(kind: str, plain: harness.RedisServer) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The topology's object (what a fault hits) and the settings that reach it."""
    if kind == "single":
        yield plain, {}
    elif kind == "sentinel":
        with SentinelGroup(fenced=True) as group:  # docs/deploying.md's fence
            factory = "django_redis.pool.SentinelConnectionFactory"
            options = {"CONNECTION_FACTORY": factory, "SENTINELS": group.sentinels}
            cache = {"BACKEND": "django_redis.cache.RedisCache", "OPTIONS": options}
            yield group, {"CACHES": {**cache, "LOCATION": f"redis://{group.service_name}/0"}}
    else:  # the cache stays on the single node; decisions go to the cluster
        with ClusterHarness() as cluster:
            cache = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": plain.url}
            yield cluster, {"CACHES": cache, "CLUSTER_URL": cluster.url}


def most_admitted(samples: list[Sample]) -> tuple[dict[int, int], float | None]:
    """Per client, the most /api/ admissions certainly decided within one window (all sent and
    answered within SUITE_WINDOW of the first one's sending); when the first excess began."""
    spans: dict[int, list[tuple[float, float]]] = {}
    for s in samples:
        if not s.closed and s.status == 200:
            spans.setdefault(s.client, []).append((s.end - s.ms / 1000, s.end))
    most, excess = {}, []
    for client, mine in spans.items():
        mine.sort()
        counts = [
            sum(end - t < SUITE_WINDOW for _, end in mine[i:]) for i, (t, _) in enumerate(mine)
        ]
        most[client] = max(counts)
        excess += [t for (t, _), n in zip(mine, counts, strict=True) if n > SUITE_LIMIT]
    return most, min(excess, default=None)


def verdict(value: int) -> str:
    return f"{value} {'PASS' if value == 0 else 'FAIL'}"


def one_run(
    name: str, server: str, env: dict[str, str], topo: Any, seconds: float, log: Path
) -> tuple[list[str], bool]:
    """One fault under load on one server: the row of the table, and whether it failed."""
    fault, index = FAULTS[name], log.stem
    srv = serve(harness.Gunicorn if server == "gunicorn" else harness.Uvicorn, env, log)
    WS_RESULT.clear()
    t0 = time.perf_counter()
    cap = int(seconds * 3 * SUITE_CLIENTS / SUITE_INTERVAL)
    load = Load(srv.port, SUITE_CLIENTS, cap, t0, t0 + seconds + 120, prefix=f"{index}-")
    load.interval, load.every = SUITE_INTERVAL, SUITE_EVERY
    try:
        load.start()
        time.sleep(seconds * 0.25)
        began = time.perf_counter() - t0
        try:
            done, broken = fault.inject(topo, srv.port, t0 + seconds * 0.9) or "", False
        except Exception as exc:  # the fault did not happen as meant: the run fails
            done, broken = f"the fault failed: {exc!r}", True
        ended = time.perf_counter() - t0
        time.sleep(max(0.0, t0 + max(seconds, ended + BREAKER_INTERVAL + 1) - time.perf_counter()))
    finally:
        load.finish()
        srv.stop()
    tracebacks = log.read_text(errors="replace").count("Traceback")
    samples = load.samples
    # An outage excuses the 503s of requests in flight from its start to one breaker interval
    # (and a margin) after its end.
    low, high = (began, ended + BREAKER_INTERVAL + 0.5) if fault.outage else (0.0, 0.0)
    unavailable = [s for s in samples if s.status == 503]
    healthy = [s.end for s in unavailable if not (s.end > low and s.end - s.ms / 1000 < high)]
    errors = sum(s.status < 0 or s.status >= 500 and s.status != 503 for s in samples)
    n503 = len(healthy)
    note = f"{len(unavailable) - n503} in the outage" if fault.outage else done
    if healthy:
        note = f"{note}; 503s healthy {min(healthy):.1f}-{max(healthy):.1f} s".lstrip("; ")
    if WS_RESULT:
        stats, latency = WS_RESULT[0]
        errors += sum(v for k, v in stats.items() if k not in ("echoed", "throttled", CLOSED))
        n503 += stats.get("throttled", 0)
        note = ", ".join(f"{k}: {v}" for k, v in sorted(stats.items()))
        note = f"WS {note}; echo p99 {harness.p99(latency or [float('nan')]):.1f} ms"
    most, first = most_admitted(samples)
    over = sum(n > SUITE_LIMIT for n in most.values())
    if first is not None:
        note = f"{note}; over {SUITE_LIMIT}/s from {first:.1f} s".lstrip("; ")
    ms = [s.ms for s in samples if s.closed and s.status == 200] or [float("nan")]
    statuses = ", ".join(f"{k}: {v}" for k, v in sorted(Counter(s.status for s in samples).items()))
    over_text = verdict(over) + (f" (max {max(most.values())})" if over else "")
    row = [fault.label, server, f"{began:.1f}-{ended:.1f}", str(len(samples)), statuses]
    row += [verdict(errors + tracebacks), verdict(n503), over_text, f"{harness.p99(ms):.1f}", note]
    return row, bool(broken or errors or tracebacks or n503 or over)


def suite(args: argparse.Namespace) -> int:
    runs = [(n, s) for n in args.only for s in FAULTS[n].servers if s in args.servers]
    share = args.seconds / max(1, len(runs))
    workdir = Path(tempfile.mkdtemp(prefix="bench-load-"))
    plain = harness.RedisServer()
    rows, failed = [], False
    header = ("fault", "server", "fault at s", "requests", "statuses", "500s", "503s healthy")
    header += (f"clients over {SUITE_LIMIT}/s", "p99 ms /items/", "")
    try:
        harness.print_machine("gunicorn", "uvicorn", "channels", "wsproto", "django-redis")
        plain.start()
        for kind in ("single", "sentinel", "cluster"):
            mine = [(n, s) for n, s in runs if FAULTS[n].topology == kind]
            if not mine:
                continue
            with topology(kind, plain) as (topo, conf):
                rules = SUITE_RULES.format(limit=SUITE_LIMIT)
                env = project(workdir, f"bench_load_{kind}", plain.url, rules, **conf)
                for name, server in mine:
                    seconds = max(share, FAULTS[name].minimum)
                    print(f"{FAULTS[name].label} under {server}, {seconds:.0f} s", flush=True)
                    log = workdir / f"r{len(rows)}.log"
                    row, bad = one_run(name, server, env, topo, seconds, log)
                    rows.append(row)
                    failed |= bad
        print(
            f"\n## Faults under load ({SUITE_CLIENTS} clients, one request per "
            f"{SUITE_INTERVAL * 1000:g} ms each, every {SUITE_EVERY}nd to /items/; gunicorn "
            f"{WORKERS} x {THREADS} gthread, uvicorn {WORKERS} workers)\n"
        )
        harness.table(header, rows)
        print("\nFAIL" if failed else "\nPASS")
        return 1 if failed else 0
    finally:
        plain.close()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--fault", choices=("kill", "stop", "none"), default="kill")
    p.add_argument(
        "--phases", type=float, nargs=3, default=(8.0, 7.0, 8.0), metavar="S",
        help="seconds before, during and after the outage (8 7 8; the breaker's interval is "
        "added to the last)",
    )  # fmt: skip
    p.add_argument("--faults", action="store_true", help="the faults under load instead")
    p.add_argument("--seconds", type=float, default=300.0, help="--faults: load in all (300)")
    p.add_argument(
        "--only", nargs="+", choices=FAULTS, default=list(FAULTS), metavar="FAULT",
        help="--faults: these only, of " + ", ".join(FAULTS),
    )  # fmt: skip
    p.add_argument("--servers", nargs="+", choices=SERVERS, default=SERVERS)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))  # run the finally
    if args.faults:
        return suite(args)
    before, outage, after = args.phases
    if before + outage + after + BREAKER_INTERVAL > 50:
        p.error("the phases must fit in the /api/ rule's one-minute window")
    workdir = Path(tempfile.mkdtemp(prefix="bench-load-"))
    redis = harness.RedisServer()
    server: harness.Gunicorn | None = None
    load: Load | None = None
    try:
        harness.print_machine("gunicorn")
        redis.start()
        env = project(workdir, "bench_load_settings", redis.url, RULES.format(limit=LIMIT))
        server = serve(harness.Gunicorn, env, workdir / "gunicorn.log")
        t0 = time.perf_counter()
        load = Load(server.port, CLIENTS, MAX_REQUESTS, t0, t0 + before + outage + after + 15)
        load.start()

        def at(offset: float) -> float:
            time.sleep(max(0.0, t0 + offset - time.perf_counter()))
            return time.perf_counter() - t0

        down_at = at(before)
        {"kill": redis.kill, "stop": redis.pause, "none": lambda: None}[args.fault]()
        at(down_at + outage)
        {"kill": redis.start, "stop": redis.resume, "none": lambda: None}[args.fault]()
        back_at = time.perf_counter() - t0
        end_at = at(back_at + after + BREAKER_INTERVAL)
        load.finish()
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
