"""Load test of the example project while Redis is killed and restarted (not part of the suite).

    .venv/bin/python bench/load.py                 # about 30 s; --help for the knobs
    .venv/bin/python bench/load.py --fault none    # control run: same load, Redis up
    .venv/bin/python bench/load.py --fault stop    # Redis hung (SIGSTOP) instead of killed

One run, on loopback only, bounded in time (--time-limit) and in requests
(--max-requests):

1. starts its own redis-server on a free 127.0.0.1 port (no RDB, no AOF) and makes a
   fresh SQLite database in a temporary directory (``manage.py migrate``);
2. creates two rules there: ``bench-api`` on ``/api/`` (fail-open, a per-client limit
   keyed on the ``X-Client`` header, ``sliding_window_log`` so that the count is exact
   over the whole run) and ``bench-items`` on ``^/items/\\d+/$`` (fail-closed, a limit
   no client reaches: it answers 200 while Redis is up and 503 while it is down);
3. serves ``example_project.wsgi`` with gunicorn (gthread workers, several processes)
   on a free 127.0.0.1 port, with the example project's settings (REDIS_URL pointing at
   the bench Redis) plus DEBUG off and logging of errors to a file;
4. runs N client threads, each with its own X-Client value, pacing its requests, half
   of them on one keep-alive connection and half opening a new connection per request;
   ``--closed-every`` sets the share of requests sent to the fail-closed path;
5. phases: *before* (Redis up), *outage* (the redis-server is killed with SIGKILL),
   *after* (a new redis-server on the same port, empty, for --after seconds plus the
   breaker interval); ``--fault stop`` freezes Redis with SIGSTOP instead (a hung
   server, then SIGCONT: back with its data), ``--fault none`` is a control run;
6. prints, per phase: requests, status counts, 5xx on the fail-open path (must be 0),
   p50/p99 latency, admitted requests per client against the limit; a per-second
   timeline; the recovery of the fail-closed path; what Redis holds at the end; the
   lines the server logged; and exits 1 if a must-hold check failed.

Every process it starts (redis-server, gunicorn and its workers) is stopped in a
``finally``; the temporary directory is removed unless --keep.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"

sys.path.insert(0, str(REPO))
from tests.redis_server import RedisServer as HarnessRedisServer  # noqa: E402

API_PATH = "/api/items/"
PHASES = ("before", "outage", "after")
FAULTS = {
    "kill": "SIGKILL, then a new empty redis-server on the same port",
    "stop": "SIGSTOP, then SIGCONT (hung, then back with its data)",
    "none": "none (control run: Redis up throughout)",
}

# -- processes -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def redis_ping(port: int, timeout: float = 0.5) -> bool:
    """PING without redis-py, so this process imports nothing of the project."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer(HarnessRedisServer):
    """The test harness's redis-server (a free loopback port, no persistence; killed, paused,
    started again on the same port), logging into the run's directory, plus redis-cli for the
    report."""

    def __init__(self, workdir: Path) -> None:
        super().__init__()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = str(workdir)

    def thaw(self) -> None:
        """SIGCONT, then wait until it answers again."""
        self.resume()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not redis_ping(self.port):
            time.sleep(0.02)

    def command(self, *args: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-h", HOST, "-p", str(self.port), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout


class Gunicorn:
    """gunicorn in a session of its own, so its workers are stopped with it."""

    def __init__(self, env: dict[str, str], workdir: Path, workers: int, threads: int) -> None:
        self.env = env
        self.log = workdir / "gunicorn.log"
        self.port = 0
        self.workers = workers
        self.threads = threads
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        for _ in range(3):
            self.port = free_port()
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "gunicorn",
                        "example_project.wsgi:application",
                        "--bind",
                        f"{HOST}:{self.port}",
                        "--workers",
                        str(self.workers),
                        "--worker-class",
                        "gthread",
                        "--threads",
                        str(self.threads),
                        "--keep-alive",
                        "5",
                        "--timeout",
                        "30",
                        "--graceful-timeout",
                        "5",
                        "--chdir",
                        str(REPO),
                        "--error-logfile",
                        "-",
                        *self._no_control_socket(),
                    ],
                    cwd=REPO,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            if self._ready():
                return
            self.stop()
        raise RuntimeError(f"gunicorn did not start; see {self.log}")

    def _no_control_socket(self) -> list[str]:
        """Recent gunicorn opens a control socket under ~/.gunicorn unless told not to."""
        out = subprocess.run(
            [sys.executable, "-m", "gunicorn", "--help"], capture_output=True, text=True, timeout=30
        )
        return ["--no-control-socket"] if "--no-control-socket" in out.stdout else []

    def _ready(self) -> bool:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection(HOST, self.port, timeout=2)
                conn.request("GET", "/")
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    return True
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the master leads its own process group
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # graceful: the workers finish and exit
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        # Workers left behind by a master that died: they are in its process group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


# -- the project: database, rules, settings ----------------------------------------

SETTINGS_TEMPLATE = '''"""Settings of one bench/load.py run: the example project's, plus what the run needs."""

from example_project.settings import *  # noqa: F403

DEBUG = False
DATABASES["default"]["NAME"] = {db!r}  # noqa: F405
DJANGO_THROTTLE = {{**DJANGO_THROTTLE, **{overrides!r}}}  # noqa: F405
LOGGING = {{
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {{"plain": {{"format": "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"}}}},
    "handlers": {{"stderr": {{"class": "logging.StreamHandler", "formatter": "plain"}}}},
    "loggers": {{
        "django.request": {{"handlers": ["stderr"], "level": "WARNING", "propagate": False}},
        "django_throttle": {{"handlers": ["stderr"], "level": "INFO", "propagate": False}},
    }},
}}
'''

SETUP_RULES = """
import json
from django_throttle.models import Rule
from django_throttle.rules import compile_rule
from django_throttle.conf import conf
api = Rule.objects.create(
    name="bench-api", scope="/api/", key_kind="header", key_arg="X-Client",
    limit={limit}, unit="minute", algorithm="sliding_window_log", fail_mode="open",
)
items = Rule.objects.create(
    name="bench-items", scope=r"^/items/\\d+/$", key_kind="header", key_arg="X-Client",
    limit=100000, unit="minute", algorithm="fixed_window", fail_mode="closed",
)
print(json.dumps({{
    "api": compile_rule(api).state_prefix,
    "items": compile_rule(items).state_prefix,
    "conf": {{k: getattr(conf, k) for k in (
        "TIMEOUT", "CONNECT_TIMEOUT", "BREAKER_INTERVAL", "LOCAL_FALLBACK", "RULES_REFRESH",
        "FLUSH_INTERVAL", "FAIL_OPEN")}},
    "uses_redis": conf.uses_redis,
}}))
"""


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    out = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode:
        raise RuntimeError(f"manage.py {args[0]} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


# -- the clients -------------------------------------------------------------------


@dataclass(slots=True)
class Sample:
    start: float  # seconds since the load started
    ms: float
    status: int  # -1: no HTTP answer (connection error or timeout)
    client: int
    path: str  # "open" or "closed"
    retry_after: bool
    error: str = ""

    @property
    def end(self) -> float:
        return self.start + self.ms / 1000


@dataclass
class Run:
    port: int
    clients: int
    interval: float
    closed_every: int
    reconnect_share: float
    max_requests: int
    deadline: float  # perf_counter
    t0: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)
    samples: list[Sample] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: int = 0

    def reconnects(self, client: int) -> bool:
        return client >= round(self.clients * (1 - self.reconnect_share))

    def take_ticket(self) -> bool:
        with self.lock:
            if self.sent >= self.max_requests:
                return False
            self.sent += 1
            return True


def client_loop(run: Run, client: int) -> None:
    reconnect = run.reconnects(client)
    headers = {"X-Client": f"c{client:02d}", "Accept": "application/json"}
    if reconnect:
        headers["Connection"] = "close"
    conn = http.client.HTTPConnection(HOST, run.port, timeout=10)
    # Clients start spread over one interval, so that they do not all send at once.
    next_at = run.t0 + run.interval * client / run.clients
    n = 0
    local: list[Sample] = []
    try:
        while not run.stop.is_set():
            now = time.perf_counter()
            if now >= run.deadline:
                break
            if next_at > now:
                time.sleep(next_at - now)
            next_at = max(next_at + run.interval, time.perf_counter() - run.interval)
            if run.stop.is_set() or not run.take_ticket():
                break
            closed = run.closed_every > 0 and n % run.closed_every == run.closed_every - 1
            path = f"/items/{client + 1}/" if closed else API_PATH
            n += 1
            started = time.perf_counter()
            status, has_retry, error = -1, False, ""
            try:
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
                resp.read()
                status = resp.status
                has_retry = resp.getheader("Retry-After") is not None
                if reconnect or resp.will_close:
                    conn.close()
            except (OSError, http.client.HTTPException) as exc:
                error = f"{type(exc).__name__}: {exc}"
                conn.close()
            local.append(
                Sample(
                    started - run.t0,
                    (time.perf_counter() - started) * 1000,
                    status,
                    client,
                    "closed" if closed else "open",
                    has_retry,
                    error,
                )
            )
    finally:
        conn.close()
        with run.lock:
            run.samples.extend(local)


def warm_up(port: int, workers: int) -> None:
    """Every worker loads its rules and opens its Redis connection before the clock starts:
    new connections are spread over the workers by the kernel, so send a few per worker."""
    for i in range(workers * 6):
        conn = http.client.HTTPConnection(HOST, port, timeout=10)
        path = API_PATH if i % 2 else "/items/1/"
        # No X-Client header: the rules are loaded, but no client counter is written.
        conn.request("GET", path, headers={"Connection": "close"})
        conn.getresponse().read()
        conn.close()


# -- figures -----------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def phase_of(t: float, kill_at: float, back_at: float) -> str:
    if t < kill_at:
        return "before"
    return "outage" if t < back_at else "after"


def status_label(status: int) -> str:
    if status == -1:
        return "no answer"
    if status in (200, 429, 503):
        return str(status)
    return "other 5xx" if status >= 500 else f"other {status}"


def summarize(
    run: Run,
    samples: list[Sample],
    kill_at: float,
    back_at: float,
    end_at: float,
    limit: int,
    workers: int,
) -> dict[str, Any]:
    by_phase: dict[str, list[Sample]] = {p: [] for p in PHASES}
    for s in samples:
        by_phase[phase_of(s.end, kill_at, back_at)].append(s)
    bounds = {"before": (0.0, kill_at), "outage": (kill_at, back_at), "after": (back_at, end_at)}
    phases = {}
    for name in PHASES:
        rows = by_phase[name]
        start, stop = bounds[name]
        entry: dict[str, Any] = {"seconds": round(stop - start, 2)}
        for kind in ("open", "closed", "all"):
            sel = [s for s in rows if kind == "all" or s.path == kind]
            counts = Counter(status_label(s.status) for s in sel)
            lat = [s.ms for s in sel if s.status != -1]
            entry[kind] = {
                "requests": len(sel),
                "statuses": dict(sorted(counts.items())),
                # A fail-closed rule's 503 is expected; any other 5xx is not.
                "5xx": sum(
                    1 for s in sel if s.status >= 500 and (kind == "open" or s.status != 503)
                ),
                "no_answer": counts.get("no answer", 0),
                "p50_ms": round(pct(lat, 50), 2),
                "p99_ms": round(pct(lat, 99), 2),
                "max_ms": round(max(lat), 2) if lat else float("nan"),
            }
        admitted: dict[str, list[int]] = {"keep-alive": [], "new connection": []}
        sent: dict[str, list[int]] = {"keep-alive": [], "new connection": []}
        for c in range(run.clients):
            mode = "new connection" if run.reconnects(c) else "keep-alive"
            mine = [s for s in rows if s.client == c and s.path == "open"]
            admitted[mode].append(sum(1 for s in mine if s.status == 200))
            sent[mode].append(len(mine))
        entry["admitted"] = {
            mode: {
                "clients": len(vals),
                "sent_median": statistics.median(sent[mode]) if sent[mode] else 0,
                "min": min(vals) if vals else 0,
                "median": statistics.median(vals) if vals else 0,
                "max": max(vals) if vals else 0,
                "per_client": vals,
            }
            for mode, vals in admitted.items()
        }
        entry["missing_retry_after"] = sum(
            1 for s in rows if s.status in (429, 503) and not s.retry_after
        )
        phases[name] = entry

    # Recovery of the fail-closed path: 503s answered after Redis was back.
    closed_after = [s for s in by_phase["after"] if s.path == "closed"]
    late_503 = [s.start for s in closed_after if s.status == 503]
    first_200 = [s.start for s in closed_after if s.status == 200]
    recovery = {
        "last_503_after_restart_s": round(max(late_503) - back_at, 3) if late_503 else None,
        "first_200_after_restart_s": round(min(first_200) - back_at, 3) if first_200 else None,
        "503_after_restart": len(late_503),
    }

    timeline = []
    for second in range(int(end_at) + 1):
        sel = [s for s in samples if second <= s.end < second + 1]
        if not sel:
            continue
        counts = Counter(status_label(s.status) for s in sel)
        lat = [s.ms for s in sel if s.status != -1]
        timeline.append(
            {
                "t": second,
                "phase": phase_of(second + 0.5, kill_at, back_at),
                "n": len(sel),
                "200": counts.get("200", 0),
                "429": counts.get("429", 0),
                "503": counts.get("503", 0),
                "other": len(sel) - counts["200"] - counts["429"] - counts["503"],
                "p50_ms": round(pct(lat, 50), 1),
                "p99_ms": round(pct(lat, 99), 1),
                "max_ms": round(max(lat), 1) if lat else float("nan"),
            }
        )
    errors = Counter(s.error.split(":")[0] for s in samples if s.error)
    slow = sorted(samples, key=lambda s: s.ms, reverse=True)[:8]
    return {
        "slowest": [
            {
                "start_s": round(s.start, 3),
                "end_s": round(s.end, 3),
                "ms": round(s.ms, 1),
                "path": s.path,
                "status": s.status,
                "client": f"c{s.client:02d}",
            }
            for s in slow
        ],
        "phases": phases,
        "recovery": recovery,
        "timeline": timeline,
        "errors": dict(errors),
        "limit": limit,
        "workers": workers,
    }


def redis_state(redis: RedisServer, prefixes: dict[str, str]) -> dict[str, Any]:
    """What Redis holds after the run: the sliding logs of the fail-open rule (one sorted
    set per client, one member per request Redis admitted since it restarted)."""
    out: dict[str, Any] = {}
    for name, prefix in prefixes.items():
        keys = [k for k in redis.command("--scan", "--pattern", prefix + "*").split() if k]
        sizes = []
        for key in keys:
            kind = redis.command("TYPE", key).strip()
            if kind == "zset":
                sizes.append(int(redis.command("ZCARD", key)))
        out[name] = {"keys": len(keys), "zcard": sorted(sizes)}
    info = dict(
        line.split(":", 1)
        for line in redis.command("INFO", "clients").splitlines()
        + redis.command("INFO", "stats").splitlines()
        if ":" in line
    )
    out["connected_clients"] = int(info["connected_clients"])
    out["connections_received"] = int(info["total_connections_received"])
    return out


LOG_PATTERNS = {
    "store unavailable (breaker opened)": "django_throttle: the store is unavailable",
    "store reachable again (breaker closed)": "the store is reachable again",
    "rules version unreadable": "could not read the rules version",
    "rules version readable again": "the rules version can be read again",
    "rules not loaded": "could not load rules",
    "django.request ERROR 'Service Unavailable' (one per 503)": "ERROR django.request: Service Unavailable",
    "django.request WARNING 'Too Many Requests' (one per 429)": "WARNING django.request: Too Many Requests",
    "Internal Server Error": "Internal Server Error",
    "Traceback": "Traceback",
    "database is locked": "database is locked",
    "worker timeout": "WORKER TIMEOUT",
    "worker booted": "Booting worker",
}


def scan_log(path: Path) -> tuple[dict[str, int], list[str]]:
    text = path.read_text(errors="replace") if path.exists() else ""
    counts = {label: text.count(needle) for label, needle in LOG_PATTERNS.items()}
    notable = [
        line
        for line in text.splitlines()
        if re.search(r"ERROR|WARNING|CRITICAL|Traceback|Error", line)
        and "django.request: Service Unavailable" not in line
        and "django.request: Too Many Requests" not in line
    ]
    return counts, notable


def code_state() -> str:
    """The commit, and a digest of uncommitted changes to django_throttle/ if any."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
        return out.stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "not a git checkout"
    diff = git("diff", "HEAD", "--", "django_throttle")
    if not diff:
        return f"{head}, django_throttle/ as committed"
    digest = hashlib.sha1(diff.encode()).hexdigest()[:10]
    return f"{head} + uncommitted changes to django_throttle/ (diff sha1 {digest})"


# -- report ------------------------------------------------------------------------


def fmt_statuses(entry: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in entry["statuses"].items()) or "-"


def report(
    result: dict[str, Any],
    meta: dict[str, Any],
    clients: int,
    fault: str,
    hang_ms: float,
    breaker_interval: float,
) -> list[str]:
    """The checks that failed (empty: all held). Prints everything."""
    phases, limit, workers = result["phases"], result["limit"], result["workers"]
    print()
    print("## Setup")
    for key, value in meta.items():
        print(f"- {key}: {value}")
    print()
    print(
        "## Per phase (a request counts in the phase its answer arrived in; latency measured by the client)"
    )
    print()
    print(
        "| phase | path | requests | statuses | unexpected 5xx | p50 ms | p99 ms | max ms |\n"
        "|---|---|---:|---|---:|---:|---:|---:|"
    )
    for name in PHASES:
        entry = phases[name]
        for kind, label in (("open", "fail-open /api/"), ("closed", "fail-closed /items/")):
            e = entry[kind]
            print(
                f"| {name} ({entry['seconds']:.1f} s) | {label} | {e['requests']} | "
                f"{fmt_statuses(e)} | {e['5xx']} | {e['p50_ms']:.1f} | {e['p99_ms']:.1f} | "
                f"{e['max_ms']:.1f} |"
            )
    print()
    print(f"## Admitted per client on /api/ (limit {limit}/minute per client, sliding log)")
    print()
    print("| phase | connections | clients | sent (median) | admitted min / median / max |")
    print("|---|---|---:|---:|---|")
    for name in PHASES:
        for mode, a in phases[name]["admitted"].items():
            print(
                f"| {name} | {mode} | {a['clients']} | {a['sent_median']:g} | "
                f"{a['min']} / {a['median']:g} / {a['max']} |"
            )
    print()
    print("Per client (before | outage | after):")
    for mode in ("keep-alive", "new connection"):
        rows = [phases[p]["admitted"][mode]["per_client"] for p in PHASES]
        print(f"- {mode}: " + " | ".join(" ".join(str(v) for v in r) for r in rows))
    print()
    print("## Timeline (1 s buckets, all paths)")
    print()
    print("| t s | phase | n | 200 | 429 | 503 | other | p50 ms | p99 ms | max ms |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in result["timeline"]:
        print(
            f"| {row['t']} | {row['phase']} | {row['n']} | {row['200']} | {row['429']} | "
            f"{row['503']} | {row['other']} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | "
            f"{row['max_ms']:.1f} |"
        )
    print()
    rec = result["recovery"]
    print("## Recovery of the fail-closed path after the restart")
    print(
        f"- 503s after Redis was back: {rec['503_after_restart']}; last one "
        f"{rec['last_503_after_restart_s']} s after the restart; first 200 "
        f"{rec['first_200_after_restart_s']} s after it"
    )
    print(f"- client-side errors (no HTTP answer): {result['errors'] or 'none'}")
    print("- slowest requests (start and end in s since the load started):")
    for s in result["slowest"]:
        print(
            f"    {s['ms']:8.1f} ms  {s['start_s']:6.2f} -> {s['end_s']:6.2f}  "
            f"{s['path']:6} {s['status']} {s['client']}"
        )
    print(f"- Redis at the end: {json.dumps(result['redis'])}")
    print()
    print("## Server log (gunicorn master and workers)")
    for label, n in result["log_counts"].items():
        print(f"- {label}: {n}")
    for line in result["log_lines"][:20]:
        print(f"    {line}")
    if len(result["log_lines"]) > 20:
        print(f"    ... {len(result['log_lines']) - 20} more")

    failures = []
    for name in PHASES:
        if phases[name]["open"]["5xx"]:
            failures.append(f"{name}: {phases[name]['open']['5xx']} 5xx on the fail-open path")
        other = phases[name]["closed"]["statuses"].get("other 5xx", 0)
        if other:
            failures.append(f"{name}: {other} 5xx other than 503 on the fail-closed path")
        if phases[name]["missing_retry_after"]:
            failures.append(f"{name}: 429/503 without Retry-After")
    hung = [s for s in result["slowest"] if s["ms"] > hang_ms]
    if hung:
        failures.append(
            f"{len(hung)}{'+' if len(hung) == len(result['slowest']) else ''} requests slower "
            f"than {hang_ms:g} ms (a request waited on the store?): {hung[:3]}"
        )
    if result["errors"]:
        failures.append(f"requests without an HTTP answer: {result['errors']}")
    for mode, a in phases["before"]["admitted"].items():
        if a["clients"] and not (a["min"] == a["max"] == limit):
            failures.append(f"before: {mode} clients admitted {a['per_client']}, not {limit} each")
    zcards = result["redis"].get("api", {}).get("zcard", [])
    if zcards != [limit] * len(zcards) or len(zcards) != clients:
        failures.append(f"Redis does not hold {limit} admissions per client: {zcards}")
    if fault == "none":
        # Redis never went away: the limit was used up before, within the same minute.
        for name in ("outage", "after"):
            for mode, a in phases[name]["admitted"].items():
                if a["max"]:
                    failures.append(f"{name}: {mode} admitted {a['per_client']}, expected 0")
            if phases[name]["closed"]["statuses"].get("503", 0):
                failures.append(f"{name}: 503 without an outage")
    else:
        for mode, a in phases["outage"]["admitted"].items():
            if a["clients"] and a["max"] > workers * limit:
                failures.append(f"outage: {mode} admitted {a['max']} > workers x limit")
        # Killed: the new Redis is empty, every client gets a fresh window. Frozen: Redis
        # kept the log of the first phase, still within the minute, so nothing more.
        want = limit if fault == "kill" else 0
        for mode, a in phases["after"]["admitted"].items():
            if a["clients"] and not (want <= a["min"] and a["max"] <= want + workers * limit):
                failures.append(f"after: {mode} admitted {a['per_client']}, expected {want}")
        if phases["outage"]["closed"]["statuses"].get("503", 0) == 0:
            failures.append("no 503 from the fail-closed rule during the outage")
        if phases["after"]["closed"]["statuses"].get("200", 0) == 0:
            failures.append("the fail-closed path never answered 200 after the restart")
        late = result["recovery"]["last_503_after_restart_s"]
        if late is not None and late > breaker_interval + 1:
            failures.append(f"503s went on {late} s after Redis was back (breaker interval + 1 s)")
    print()
    print("## Checks")
    print("- all held" if not failures else "\n".join(f"- FAILED: {f}" for f in failures))
    return failures


# -- main --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=16, help="client threads (default 16)")
    p.add_argument(
        "--interval",
        type=float,
        default=0.05,
        help="seconds between two requests of a client (0.05)",
    )
    p.add_argument(
        "--closed-every",
        type=int,
        default=5,
        help="every Nth request of a client goes to the fail-closed path (5)",
    )
    p.add_argument(
        "--reconnect-share",
        type=float,
        default=0.5,
        help="share of clients opening a connection per request (0.5)",
    )
    p.add_argument("--workers", type=int, default=3, help="gunicorn worker processes (3)")
    p.add_argument("--threads", type=int, default=4, help="threads per gthread worker (4)")
    p.add_argument(
        "--limit", type=int, default=20, help="per-client limit per minute on /api/ (20)"
    )
    p.add_argument("--before", type=float, default=8.0, help="seconds with Redis up (8)")
    p.add_argument(
        "--outage",
        type=float,
        default=7.0,
        help="seconds with Redis down (7: not a multiple of the 2 s breaker interval, so the\n"
        "restart falls between two probes, as it would in real life)",
    )
    p.add_argument(
        "--after",
        type=float,
        default=8.0,
        help="seconds after the restart, plus BREAKER_INTERVAL (8)",
    )
    p.add_argument("--max-requests", type=int, default=15000, help="hard cap on requests (15000)")
    p.add_argument(
        "--time-limit", type=float, default=45.0, help="hard cap on the load, seconds (45)"
    )
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="a DJANGO_THROTTLE override, e.g. BREAKER_INTERVAL=1.0",
    )
    p.add_argument(
        "--fault",
        choices=sorted(FAULTS),
        default="kill",
        help="kill: SIGKILL, then a new empty redis-server on the same port (default);\n"
        "stop: SIGSTOP, then SIGCONT (a hung server that comes back with its data);\n"
        "none: a control run, the same load and phases with Redis up throughout",
    )
    p.add_argument(
        "--hang-ms",
        type=float,
        default=1000.0,
        help="a request slower than this fails the run (1000): with TIMEOUT 0.1 s and the\n"
        "breaker, no request should wait on Redis for long",
    )
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument(
        "--keep", action="store_true", help="keep the temporary directory (logs, database)"
    )
    args = p.parse_args(argv)
    if args.before + args.outage + args.after + 10 > args.time_limit:
        p.error("--time-limit must leave room for the phases (before + outage + after + 10)")
    if args.before + args.outage + args.after > 50:
        p.error(
            "the phases must fit in the rule's one-minute window: before + outage + after <= 50"
        )
    return args


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # so that the finally below stops every process started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    if shutil.which("redis-server") is None:
        print("redis-server is not installed (apt-get install redis-server)", file=sys.stderr)
        return 2
    overrides = {}
    for item in args.setting:
        name, _, value = item.partition("=")
        overrides[name] = json.loads(value)

    workdir = Path(tempfile.mkdtemp(prefix="throttle-load-"))
    redis = RedisServer(workdir)
    server: Gunicorn | None = None
    run: Run | None = None
    threads: list[threading.Thread] = []
    try:
        redis.start()
        (workdir / "bench_load_settings.py").write_text(
            SETTINGS_TEMPLATE.format(db=str(workdir / "db.sqlite3"), overrides=overrides)
        )
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "REDIS_", "DEMO_"))
        }
        env.update(
            DJANGO_SETTINGS_MODULE="bench_load_settings",
            PYTHONPATH=os.pathsep.join([str(workdir), str(REPO)]),
            REDIS_URL=f"redis://{HOST}:{redis.port}/0",
            PYTHONUNBUFFERED="1",
        )
        manage(env, "migrate", "--noinput")
        out = manage(env, "shell", "-c", SETUP_RULES.format(limit=args.limit))
        setup = json.loads(out.strip().splitlines()[-1])  # after the shell's own notices
        if not setup["uses_redis"]:
            raise RuntimeError("the example project did not pick the Redis backend")
        breaker_interval = float(setup["conf"]["BREAKER_INTERVAL"])

        server = Gunicorn(env, workdir, args.workers, args.threads)
        server.start()
        warm_up(server.port, args.workers)

        load_start = os.getloadavg()[0]
        start = time.perf_counter()
        run = Run(
            port=server.port,
            clients=args.clients,
            interval=args.interval,
            closed_every=args.closed_every,
            reconnect_share=args.reconnect_share,
            max_requests=args.max_requests,
            deadline=start + args.time_limit,
            t0=start,
        )
        threads = [
            threading.Thread(target=client_loop, args=(run, c), daemon=True)
            for c in range(args.clients)
        ]
        for t in threads:
            t.start()

        def sleep_until(offset: float) -> None:
            time.sleep(max(0.0, start + offset - time.perf_counter()))

        print(f"load: {args.clients} clients on {HOST}:{server.port}; Redis on {redis.port}")
        sleep_until(args.before)
        kill_at = time.perf_counter() - start
        if args.fault == "kill":
            redis.kill()
            print(f"t={kill_at:.2f} s: redis-server killed (SIGKILL)")
        elif args.fault == "stop":
            redis.pause()
            print(f"t={kill_at:.2f} s: redis-server frozen (SIGSTOP)")
        else:
            print(f"t={kill_at:.2f} s: control run, Redis stays up")
        sleep_until(kill_at + args.outage)
        if args.fault == "kill":
            redis.start()  # the same port
        elif args.fault == "stop":
            redis.thaw()
        back_at = time.perf_counter() - start
        if args.fault == "kill":
            print(f"t={back_at:.2f} s: redis-server answering again on the same port (empty)")
        elif args.fault == "stop":
            print(f"t={back_at:.2f} s: redis-server answering again (SIGCONT, state kept)")
        sleep_until(back_at + args.after + breaker_interval)
        run.stop.set()
        for t in threads:
            t.join(15)
        end_at = time.perf_counter() - start
        print(f"t={end_at:.2f} s: load stopped; {run.sent} requests sent")

        result = summarize(
            run,
            list(run.samples),
            kill_at,
            back_at,
            end_at,
            args.limit,
            args.workers,
        )
        result["redis"] = redis_state(redis, {"api": setup["api"], "items": setup["items"]})
        server.stop()  # first, so that the workers' exit lines are in the log
        time.sleep(0.2)
        result["log_counts"], result["log_lines"] = scan_log(server.log)
        meta = {
            "clients": f"{args.clients} threads, one request every {args.interval * 1000:g} ms each, "
            f"every {args.closed_every}th to the fail-closed path; "
            f"{sum(not run.reconnects(c) for c in range(args.clients))} on one keep-alive connection, "
            f"{sum(run.reconnects(c) for c in range(args.clients))} on a new connection per request",
            "server": f"gunicorn {args.workers} gthread workers x {args.threads} threads, "
            "example_project.wsgi, DEBUG off, SQLite",
            "phases": f"before {kill_at:.2f} s, outage {back_at - kill_at:.2f} s, "
            f"after {end_at - back_at:.2f} s; fault: {FAULTS[args.fault]}",
            "load average (1 min) at start / end": f"{load_start:.2f} / {os.getloadavg()[0]:.2f}",
            "settings": json.dumps(setup["conf"]),
            "code": code_state(),
            "machine": f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
            f"{subprocess.run(['redis-server', '--version'], capture_output=True, text=True).stdout.split()[2]}",
        }
        failures = report(result, meta, args.clients, args.fault, args.hang_ms, breaker_interval)
        if args.json:
            args.json.write_text(json.dumps({"meta": meta, **result}, indent=2, default=str))
        return 1 if failures else 0
    finally:
        if run is not None:
            run.stop.set()
            for t in threads:
                t.join(15)
        if server is not None:
            server.stop()
        redis.stop()
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
