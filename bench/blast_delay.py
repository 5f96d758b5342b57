"""An unthrottled path while one client floods a delay rule (docs/bounds.md, "Delayed requests")."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import harness
from redis import Redis

PROBE_EVERY = 0.1
THREADS, FLOOD = 4, 8  # the gunicorn worker's threads; the flooding client's connections

SETTINGS = """from example_project.settings import *  # noqa: F403

DEBUG = False
DATABASES["default"]["NAME"] = {db!r}  # noqa: F405
DJANGO_THROTTLE = {{**DJANGO_THROTTLE, **{throttle!r}}}  # noqa: F405
"""

RULES = """from django_throttle.models import Rule
Rule.objects.create(name="bench-delay", scope="/api/", limit=2, unit="second",
    algorithm="leaky_bucket", burst=20, action="delay")
"""

RUNS: list[tuple[str, dict[str, Any], str]] = [
    (
        "former default: MAX_DELAYED 10, no cap per client",
        {"MAX_DELAYED": 10, "MAX_DELAYED_PER_CLIENT": None},
        "/api/items/",
    ),
    ("default: MAX_DELAYED auto, 1 per client", {}, "/api/items/"),
    ("for scale: the same flood on a path with no rule", {}, "/items/2/"),
]


def run_once(
    workdir: Path, env: dict[str, str], threads: int, flood: int, seconds: float, path: str
) -> tuple[list[float], Counter[int]]:
    """Probe latencies (ms) and flood statuses of one server under one client's flood."""
    server = harness.Gunicorn(env, workdir / "gunicorn.log", 1, threads)
    try:
        server.start()
        harness.http_get(server.port, "/items/1/")  # the worker has loaded its rules
        stop = threading.Event()
        statuses: Counter[int] = Counter()
        lock = threading.Lock()

        def flooding() -> None:
            while not stop.is_set():
                status = harness.http_get(server.port, path)
                with lock:
                    statuses[status] += 1

        flooders = [threading.Thread(target=flooding) for _ in range(flood)]
        for t in flooders:
            t.start()
        latencies: list[float] = []
        end = time.perf_counter() + seconds
        time.sleep(0.5)  # the flood is on
        while time.perf_counter() < end:
            start = time.perf_counter()
            if harness.http_get(server.port, "/items/1/") == 200:
                latencies.append((time.perf_counter() - start) * 1000)
            time.sleep(max(0.0, PROBE_EVERY - (time.perf_counter() - start)))
        stop.set()
        server.stop()  # the flood's held requests end with it
        for t in flooders:
            t.join(15)
        return latencies, statuses
    finally:
        server.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=8.0, help="flood per run (8)")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))  # run the finally
    workdir = Path(tempfile.mkdtemp(prefix="bench-blast-delay-"))
    redis = harness.RedisServer()
    try:
        harness.print_machine("gunicorn")
        redis.start()
        env = harness.project_env(workdir, "bench_blast_settings", redis.url)
        settings = workdir / "bench_blast_settings.py"
        settings.write_text(SETTINGS.format(db=str(workdir / "db.sqlite3"), throttle={}))
        harness.manage(env, "migrate", "--noinput")
        harness.manage(env, "shell", "-c", RULES)
        rows = []
        for name, throttle, path in RUNS:
            settings.write_text(SETTINGS.format(db=str(workdir / "db.sqlite3"), throttle=throttle))
            with Redis.from_url(redis.url) as client:
                for key in client.keys("thr:*{*}"):  # the bucket starts empty
                    client.delete(key)
            latencies, statuses = run_once(workdir, env, THREADS, FLOOD, args.seconds, path)
            rows.append(
                (
                    name,
                    len(latencies),
                    f"{statistics.median(latencies):.1f}",
                    f"{max(latencies):.1f}",
                    statuses[200],
                    statuses[429],
                    sum(n for s, n in statuses.items() if s not in (200, 429)),
                )
            )
        print(
            f"\n## One client flooding a delay rule ({FLOOD} connections, {args.seconds:g} s), "
            f"gunicorn 1 x {THREADS} gthread; probe: /items/1/ (no rule) every "
            f"{PROBE_EVERY * 1000:g} ms\n"
        )
        harness.table(
            (
                "settings",
                "probes",
                "probe median ms",
                "probe max ms",
                "flood 200",
                "flood 429",
                "other",
            ),
            rows,
        )
        return 0
    finally:
        redis.close()
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)


if __name__ == "__main__":
    sys.exit(main())
