"""What the benchmarks share: redis-server, Django, requests, gunicorn, timing, tables, machine.
The redis-server (tests/redis_server.py) and the topologies (a primary with a replica,
Sentinel, a cluster: tests/redis_topology.py) are the tests' own."""

from __future__ import annotations

import contextlib
import datetime
import gc
import http.client
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

HOST = "127.0.0.1"
HOUR = 3600
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
# This checkout's tests/, whatever PYTHONPATH puts first (bench/instructions.py may count another).
sys.path.insert(0, ROOT)
from tests import redis_server  # noqa: E402
from tests.redis_server import _free_port as free_port  # noqa: E402

sys.path.remove(ROOT)


class RedisServer(redis_server.RedisServer):
    """The tests' redis-server (free loopback port, no RDB or AOF, killed, paused, started again
    on the same port), pinned to ``cpu`` (``taskset -c``) if given, and a context manager."""

    def __init__(self, cpu: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cpu = cpu

    def command(self) -> list[str]:
        args = super().command()
        return args if self.cpu is None else ["taskset", "-c", str(self.cpu), *args]

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The CPU a run pins redis-server and itself to (BENCH_CPU, default 0): two runs on
# different CPUs do not disturb each other.
CPU = int(os.environ.get("BENCH_CPU", "0"))


def pin_client(cpu: int = CPU) -> None:
    """This process on one CPU, beside the redis-server: the ratios show our own cost."""
    os.sched_setaffinity(0, {cpu})


def configure_django(
    redis_url: str,
    apps: Sequence[str] = (),
    migrate: bool = False,
    database: str | dict[str, Any] = ":memory:",
    **settings: Any,
) -> None:
    """Django configured in the process: SQLite in memory, a django-redis cache on the bench's
    server, django_throttle on Redis with a 1 s timeout (a stall of a shared machine must not
    abort a run; any timeout costs the same per call). ``database``: another SQLite name (e.g.
    ``file:x?mode=memory&cache=shared``: one for every thread) or another database's settings."""
    import django
    from django.conf import settings as django_settings

    throttle = {"BACKEND": "redis", "TIMEOUT": 1.0, "CONNECT_TIMEOUT": 1.0, "RULES_REFRESH": 3600.0}
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": database}
    throttle.update(settings.pop("DJANGO_THROTTLE", {}))
    django_settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-not-secret",
        USE_TZ=True,
        ALLOWED_HOSTS=["*"],
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", *apps],
        DATABASES={"default": database if isinstance(database, dict) else sqlite},
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url}},
        DJANGO_THROTTLE=throttle,
        **settings,
    )
    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)


THROTTLE = "django_throttle.middleware.ThrottleMiddleware"
# A site's usual middleware before ours: what a request through Django costs without us.
MIDDLEWARE = (
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
)


def configure_site(redis_url: str, urlconf: str, **settings: Any) -> None:
    """configure_django() for requests through a handler: sessions (signed cookies) and auth
    in the middleware, django_throttle's tables made, ``urlconf`` the ROOT_URLCONF."""
    configure_django(
        redis_url,
        apps=["django.contrib.sessions", "django_throttle"],
        migrate=True,
        ROOT_URLCONF=urlconf,
        MIDDLEWARE=list(MIDDLEWARE),
        SESSION_ENGINE="django.contrib.sessions.backends.signed_cookies",
        **settings,
    )


def plain_view() -> Callable[[Any], Any]:
    """A view that answers 200 ``ok`` (made once Django is set up)."""
    from django.http import HttpResponse

    return lambda request: HttpResponse("ok")


def request_case(
    name: str, app: Any, path: str, n: int = 1000, before: Callable[[], None] = lambda: None
) -> Case:
    """GETs of ``path`` from ``n`` clients through a WSGI ``app``, each answered 200;
    ``before`` runs untimed before each one."""
    from django.test import RequestFactory

    requests = [RequestFactory().get(path, REMOTE_ADDR=a).environ for a in addresses(n)]

    def call(environ: dict[str, Any]) -> None:
        response = app(environ, lambda *_: None)  # no start_response: the bench reads the response
        assert response.status_code == 200, response.status_code

    return Case(name, call, lambda i: before() or dict(requests[i % n]))


def create_rules(rules: Sequence[tuple[str, str, int, str]]) -> None:
    """Rows in the database, as the admin saves them: (scope, algorithm, limit, unit) each."""
    from django_throttle.models import Rule

    for scope, algorithm, limit, unit in rules:
        name = f"bench-{Rule.objects.count()}"
        Rule.objects.create(name=name, scope=scope, algorithm=algorithm, limit=limit, unit=unit)


def make_rule(id: int, algorithm: str, limit: int, period: int = HOUR, **fields: Any) -> Any:
    """A compiled rule without the database, as the rule cache builds one."""
    from django_throttle.compiled import build_rule

    name = f"bench-{id}"
    return build_rule(id=id, name=name, algorithm=algorithm, limit=limit, period=period, **fields)


def algorithms() -> list[str]:
    from django_throttle.choices import Algorithm

    return [str(a) for a in Algorithm.values]


def addresses(n: int, prefix: str = "198.18") -> list[str]:
    """Distinct client addresses (the 198.18.0.0/15 benchmarking range)."""
    assert n <= 65536
    return [f"{prefix}.{i // 256}.{i % 256}" for i in range(n)]


def http_get(port: int, path: str, timeout: float = 30.0) -> int:
    """The status of one GET on a new connection; -1 without an HTTP answer."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return -1
    finally:
        conn.close()


class Gunicorn:
    """The example project under gunicorn (``workers`` processes of ``threads`` threads), in a
    session of its own, so that its workers stop with it."""

    def __init__(
        self, env: dict[str, str], log: str | os.PathLike[str], workers: int, threads: int = 0
    ) -> None:
        self.env, self.log, self.port = env, log, free_port()
        self.args = [sys.executable, "-m", *self.command(workers, threads)]
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self, workers: int, threads: int) -> list[str]:
        args = ["gunicorn", "example_project.wsgi:application", "--bind", f"{HOST}:{self.port}"]
        args += ["--workers", str(workers), "--worker-class", "gthread", "--threads", str(threads)]
        return [*args, "--timeout", "30", "--graceful-timeout", "5", "--error-logfile", "-"]

    def start(self) -> None:
        with open(self.log, "ab") as log:
            out = {"stdin": subprocess.DEVNULL, "stdout": log, "stderr": log}
            self.proc = subprocess.Popen(
                self.args, cwd=ROOT, env=self.env, start_new_session=True, **out
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            if http_get(self.port, "/", timeout=10) == 200:
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.args[2]} did not start; see {self.log}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.terminate()  # graceful: the workers finish and exit
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # workers left by a master that died


class Uvicorn(Gunicorn):
    """The example project's ASGI application (HTTP, and WebSockets through wsproto) under
    uvicorn with ``workers`` processes; ``threads`` is unused."""

    def command(self, workers: int, threads: int) -> list[str]:
        args = ["uvicorn", "example_project.asgi:application", "--host", HOST]
        args += ["--port", str(self.port), "--workers", str(workers), "--ws", "wsproto"]
        return [*args, "--lifespan", "off", "--no-access-log", "--timeout-graceful-shutdown", "5"]


@dataclass
class Case:
    """``op(prep(i))`` is call ``i``; only ``op`` is timed (``prep`` builds a fresh request)."""

    name: str
    op: Callable[[Any], Any]
    prep: Callable[[int], Any] = int
    samples: list[int] = field(default_factory=list)

    @property
    def median_us(self) -> float:
        return median(self.samples) / 1000

    @property
    def p99_us(self) -> float:
        return p99(self.samples) / 1000


def interleaved(
    cases: Sequence[Case], rounds: int, per_round: int, warmup: int, block: int = 50
) -> None:
    """``warmup`` untimed calls per case, then rounds of ``per_round`` timed calls per case, in
    blocks of ``block`` calls, the cases taking turns block by block from a rotating first case:
    machine noise hits every case alike, and no case pays for the caches another left cold."""
    for case in cases:
        for i in range(warmup):
            case.op(case.prep(i))
    gc.collect()
    pc, n, i = time.perf_counter_ns, len(cases), warmup
    for turn in range(rounds * max(1, per_round // block)):
        for case in (*cases[turn % n :], *cases[: turn % n]):
            for j in range(i, i + block):
                arg = case.prep(j)
                t = pc()
                case.op(arg)
                case.samples.append(pc() - t)
        i += block


def raw_evalsha(url: str) -> Case:
    """The reference: redis-py's EVALSHA of ``return 1``, on a client with our socket timeout."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=1.0)
    sha = client.script_load("return 1")
    return Case("raw EVALSHA `return 1` (redis-py)", lambda _: client.evalsha(sha, 0))


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    return (s[len(s) // 2] + s[(len(s) - 1) // 2]) / 2


def p99(values: Sequence[float]) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a Markdown table; columns whose cells are all numbers are right-aligned."""
    cells = [[str(c) for c in header], *([str(c) for c in row] for row in rows)]
    widths = [max(3, *(len(r[i]) for r in cells)) for i in range(len(header))]
    right = [i > 0 and all(_numeric(r[i]) for r in cells[1:]) for i in range(len(header))]
    rule = ["-" * (w - 1) + (":" if r else "-") for w, r in zip(widths, right, strict=True)]
    just = [str.rjust if r else str.ljust for r in right]
    for row in (cells[0], rule, *cells[1:]):
        print("| " + " | ".join(j(c, w) for c, w, j in zip(row, widths, just, strict=True)) + " |")


def _numeric(text: str) -> bool:
    return text in ("", "-") or text.rstrip("x").replace(".", "", 1).replace("/", "").isdigit()


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def print_machine(*dists: str) -> None:
    """Date, CPU, Python and the versions a figure depends on (``dists``: peers too)."""
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((li.split(":", 1)[1].strip() for li in f if li.startswith("model name")), cpu)
    memory = "memory unknown"
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:  # MemTotal: ... kB
        memory = f"{round(int(f.readline().split()[1]) / 2**20)} GB"
    redis = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    server = next((w[2:] for w in redis.stdout.split() if w.startswith("v=")), "unknown")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print("\n## Machine\n")
    rows = [("date", now), ("machine", f"{cpu}, {os.cpu_count()} cores, {memory}")]
    rows += [("python", platform.python_version()), ("redis-server", server)]
    rows += [("redis-py", version("redis")), *((d, version(d)) for d in ("hiredis", "Django"))]
    table(("", ""), [*rows, *((d, version(d)) for d in dists)])
