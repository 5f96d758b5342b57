"""What the size of the rule table costs (docs/bounds.md, "Resets and rule changes", "Rules at
scale")."""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import harness

REFRESH = 1.0
urlpatterns: list[Any] = []  # this module is the ROOT_URLCONF
PATH = "/p7/items/"  # one prefix rule (/p7/) and one regex rule (^/p7/\w+/$) match it


def urls() -> None:
    from django.urls import re_path

    urlpatterns[:] = [re_path(r"^", harness.plain_view(), name="n7")]


def table_of(n: int) -> list[dict[str, Any]]:
    """``n`` rules: a tenth regexes, the rest prefixes and names; generous limits."""
    rules: list[dict[str, Any]] = []
    for i in range(n):
        kind = i % 10
        rule: dict[str, Any] = {"name": f"rule-{i}", "limit": 1_000_000, "unit": "minute"}
        if kind == 0:
            rule["scope"] = rf"^/p{i // 10}/\w+/$"
        elif kind % 2:
            rule["scope"] = f"/p{i // 10}/" if kind == 1 else f"/p{i // 10}/{kind}/"
            if kind == 3:
                rule["methods"] = "POST"
        else:
            rule["scope"] = f"n{i // 10}-{kind}"
        rules.append(rule)
    return rules


def import_file(path: str, *args: str) -> tuple[float, float]:
    """Seconds of ``throttle_import`` on the clock and of this process's CPU (on a shared
    machine the second is what the import costs)."""
    from django.core.management import call_command

    started, cpu = time.perf_counter(), time.process_time()
    with open(os.devnull, "w") as out:
        call_command("throttle_import", path, *args, stdout=out)
    return time.perf_counter() - started, time.process_time() - cpu


def request_once(app: Any, environ: dict[str, Any]) -> float:
    started = time.perf_counter()
    response = app(dict(environ), harness.start_response)
    assert response.status_code == 200, response.status_code
    return (time.perf_counter() - started) * 1000


class Collections:
    """The longest pause of Python's garbage collector (any thread) since ``start()``, ms."""

    def __init__(self) -> None:
        self.began = 0.0
        self.longest = 0.0
        gc.callbacks.append(self.callback)

    def start(self) -> None:
        self.longest = 0.0

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.began = time.perf_counter()
        else:
            self.longest = max(self.longest, (time.perf_counter() - self.began) * 1000)


COLLECTIONS = Collections()


def slowest_after(
    app: Any, environ: dict[str, Any], event: Any, seconds: float
) -> tuple[float, float]:
    """Serve requests from 4 threads, run ``event()`` after a moment, go on for ``seconds``:
    the slowest request and the longest garbage collection meanwhile (ms). The process is
    busy before the event, as a server is."""
    slowest = [0.0]
    stop = [float("inf")]

    def serve() -> None:
        from django.db import connections

        while time.monotonic() < stop[0]:
            slowest[0] = max(slowest[0], request_once(app, environ))
            time.sleep(0.002)
        connections.close_all()

    threads = [threading.Thread(target=serve) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(REFRESH / 2)
    slowest[0] = 0.0
    COLLECTIONS.start()
    event()
    stop[0] = time.monotonic() + seconds
    for thread in threads:
        thread.join()
    return slowest[0], COLLECTIONS.longest


ELSEWHERE = """
import sys, django
from django.conf import settings
settings.configure(**{settings_json})
django.setup()
from django_throttle.models import Rule
from django_throttle.api import reset
from django_throttle.rules import get_rules
get_rules()  # its own first load, before the event
sys.stdin.readline()
if sys.argv[1] == "reset":
    reset("/p7/", "ip:198.18.0.1")
else:
    Rule.objects.filter(name="rule-1").update(limit=999_999)
"""


def elsewhere(what: str, database: str, url: str) -> Any:
    """A function running ``what`` (reset, change) in another process on the same database."""
    settings = {
        "INSTALLED_APPS": ["django.contrib.contenttypes", "django.contrib.auth", "django_throttle"],
        "DATABASES": {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": database}},
        "CACHES": {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}},
        "DJANGO_THROTTLE": {"BACKEND": "redis"},
        "USE_TZ": True,
        "SECRET_KEY": "bench",
    }
    code = ELSEWHERE.replace("{settings_json}", repr(settings))
    # Started before the event, its imports and set-up done: only the reset or the change
    # falls inside the measured time.
    proc = subprocess.Popen(
        [sys.executable, "-c", code, what],
        stdin=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
    )
    time.sleep(3)  # its interpreter and Django set up

    def event() -> None:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        assert proc.wait(30) == 0

    return event


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rules", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=2000)
    options = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="blast-rules-")
    database = os.path.join(workdir, "rules.sqlite3")
    with harness.RedisServer(cpu=harness.CPU) as server:
        harness.pin_client(harness.CPU)
        harness.configure_throttled(
            server.url,
            __name__,
            database,
            DEBUG_PROPAGATE_EXCEPTIONS=True,
            DJANGO_THROTTLE={"RULES_REFRESH": REFRESH},
        )
        urls()
        from django.core.handlers.wsgi import WSGIHandler

        from django_throttle.api import reset
        from django_throttle.models import Rule
        from django_throttle.rules import RedisVersion, RuleCache, load_rules
        from django_throttle.runtime import replace_runtime, runtime

        rules = table_of(options.rules)
        small = [r for r in rules if r["name"] in ("rule-70", "rule-71")]
        small += [r for r in rules if r["scope"].startswith("n")][:8]
        # The same table with its regexes written as prefixes, but for the one the path
        # matches: what the table costs apart from its regexes.
        prefixes = [
            {**r, "scope": f"/q{r['name']}/"}
            if r["scope"].startswith("^") and r not in small
            else r
            for r in rules
        ]
        files = {}
        for name, chosen in (("all", rules), ("small", small), ("prefixes", prefixes)):
            files[name] = os.path.join(workdir, f"{name}.json")
            with open(files[name], "w") as f:
                json.dump({"rules": chosen}, f)

        imports = [
            ("fresh", import_file(files["all"])),
            ("unchanged re-import", import_file(files["all"])),
            ("--dry-run", import_file(files["all"], "--dry-run")),
        ]
        assert Rule.objects.count() == options.rules
        compile_s = []
        for _ in range(3):
            started = time.perf_counter()
            loaded = load_rules()
            compile_s.append(time.perf_counter() - started)
        assert len(loaded) == options.rules
        Rule.objects.filter(name="rule-1").update(limit=999_999)
        started = time.perf_counter()
        load_rules(loaded)
        reload_s = time.perf_counter() - started

        environ = harness.environ(PATH, "198.18.0.1")
        harness.change_throttle(RULES_REFRESH=3600.0)
        # Each table loaded into a rule cache of its own; the cases take turns, block by
        # block (machine noise hits each alike), each request served with its table's cache.
        caches = {}
        for name in ("small", "prefixes", "all"):
            import_file(files[name], "--prune")
            caches[name] = RuleCache(RedisVersion())
            caches[name].get()
        app = WSGIHandler()

        def served_with(name: str) -> Any:
            def prep(i: int) -> None:
                runtime().put(caches[name])

            return harness.Case(name, lambda _: request_once(app, environ), prep)

        cases = [served_with(name) for name in caches]
        harness.interleaved(cases, rounds=1, per_round=options.requests, warmup=100)
        costs = {case.name: case.median_us / 1000 for case in cases}
        replace_runtime()
        caches.clear()  # one table in memory from here on, as in a real process
        del cases, loaded
        gc.collect()

        waits: dict[str, list[tuple[float, float]]] = {}
        for name in ("all", "prefixes"):
            harness.change_throttle(RULES_REFRESH=3600.0)
            import_file(files[name], "--prune")
            harness.change_throttle(RULES_REFRESH=REFRESH)
            app = WSGIHandler()
            COLLECTIONS.start()
            row = [(request_once(app, environ), COLLECTIONS.longest)]
            for _ in range(50):
                request_once(app, environ)
            for event in (
                lambda: elsewhere("reset", database, server.url),
                lambda: lambda: reset("/p7/", "ip:198.18.0.1"),
                lambda: elsewhere("change", database, server.url),
            ):
                row.append(slowest_after(app, environ, event(), 2 * REFRESH))
            waits[name] = row

        from django_throttle import rejection_log

        rejection_log.collect()
        harness.print_machine("google-re2")
        print(f"\n## throttle_import of {options.rules} rules (SQLite, a file)\n")
        harness.table(
            ("run", "seconds", "CPU seconds"),
            [(run, f"{wall:.2f}", f"{cpu:.2f}") for run, (wall, cpu) in imports],
        )
        print(f"\n## Compiling {options.rules} rules (load_rules(), from the database)\n")
        harness.table(
            ("", "seconds"),
            [
                ("all of them (best of 3)", f"{min(compile_s):.3f}"),
                ("a reload after one changed", f"{reload_s:.3f}"),
            ],
        )
        print(f"\n## The middleware's cost per request, median of {options.requests}\n")
        harness.table(
            ("rules", "ms per request", "ratio to 10 rules"),
            [
                ("10", f"{costs['small']:.3f}", ""),
                (
                    f"{options.rules}, of them {options.rules // 10} regexes",
                    f"{costs['all']:.3f}",
                    f"{costs['all'] / costs['small']:.2f}x",
                ),
                (
                    f"{options.rules}, of them 1 regex (the others as prefixes)",
                    f"{costs['prefixes']:.3f}",
                    f"{costs['prefixes'] / costs['small']:.2f}x",
                ),
            ],
        )
        print(
            f"\n## The slowest request after an event, {options.rules} rules "
            f"(RULES_REFRESH {REFRESH:g} s, 4 threads serving from {REFRESH / 2:g} s before to "
            f"{2 * REFRESH:g} s after)\n"
        )
        events = (
            "first request of a process (the first load)",
            "a reset in another process",
            "a reset in this process",
            "a rule changed in another process",
        )
        harness.table(
            (
                "after",
                "ms, 1000 regexes",
                "longest GC",
                "ms, 1 regex (the others as prefixes)",
                "longest GC",
            ),
            [
                (event, *(f"{ms:.1f}" for name in ("all", "prefixes") for ms in waits[name][i]))
                for i, event in enumerate(events)
            ],
        )


if __name__ == "__main__":
    main()
