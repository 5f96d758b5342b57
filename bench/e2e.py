"""End-to-end cost of the middleware per request (not part of the test suite).

Runs Django's WSGI handler in-process against its own redis-server on a free loopback
port, and measures, interleaved in one run so machine noise hits every case alike:

- a raw EVALSHA of ``return 1`` through redis-py (``Script.__call__`` on the store's client):
  the reference the target is stated against;
- the same EVALSHA through the store's own decision connections (store/connections.py), which
  skip redis-py's per-command layers: the true floor of one round trip from this process;
- a request through Django without ThrottleMiddleware (the baseline);
- the same request through ThrottleMiddleware with 1 matching rule, and with 5 matching
  rules (``*``, a path prefix, a regex, the URL name and the view's ``@throttle`` scope).

The middleware's added time is the difference of medians to the baseline, reported as a
ratio to both. Usage: ``.venv/bin/python bench/e2e.py [--quick] [--memory]``;
``--memory`` decides in the in-process backend instead, which leaves the middleware's own
Python (the raw EVALSHA is then taken on a separate client, for scale).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.redis_server import RedisServer  # noqa: E402  (the harness's managed redis-server)

N_CLIENTS = 1000
THROTTLE = "django_throttle.middleware.ThrottleMiddleware"
BASE_MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]

urlpatterns: list = []  # filled in by configure(); this module is the ROOT_URLCONF


def configure(redis_url: str, db_path: str, backend: str = "redis") -> None:
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django.contrib.sessions",
            "django_throttle",
        ],
        MIDDLEWARE=BASE_MIDDLEWARE,
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": db_path}},
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url}},
        DJANGO_THROTTLE={"RULES_REFRESH": 3600.0, "TIMEOUT": 1.0, "BACKEND": backend},
        SESSION_ENGINE="django.contrib.sessions.backends.signed_cookies",
        USE_TZ=True,
    )
    django.setup()

    from django.http import HttpResponse
    from django.urls import path

    from django_throttle import throttle

    def plain(request):
        return HttpResponse("ok")

    @throttle("dec")
    def decorated(request):
        return HttpResponse("ok")

    urlpatterns[:] = [
        path("p/", plain, name="plain"),
        path("api/x/", decorated, name="named"),
    ]


def make_rules() -> None:
    """Five rules: /p/ matches only the first ('*'), /api/x/ all five."""
    from django_throttle.models import Rule

    for i, scope in enumerate(["*", "/api/", r"^/api/x/$", "named", "dec"]):
        Rule.objects.create(
            name=f"r{i}",
            scope=scope,
            limit=1_000_000_000,
            unit="hour",
            algorithm=["sliding_window_counter", "token_bucket", "fixed_window"][i % 3],
        )


def handler(with_throttle: bool):
    from django.conf import settings
    from django.core.handlers.wsgi import WSGIHandler

    settings.MIDDLEWARE = BASE_MIDDLEWARE + ([THROTTLE] if with_throttle else [])
    return WSGIHandler()  # the middleware chain is built here, from the settings of now


def environs(path: str) -> list[dict]:
    from django.test import RequestFactory

    factory = RequestFactory()
    return [
        factory.get(path, REMOTE_ADDR=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}").environ
        for i in range(N_CLIENTS)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument(
        "--memory", action="store_true", help="decide in process memory: the Python alone"
    )
    args = parser.parse_args()
    rounds, per_round = (3, 500) if args.quick else (7, 2000)

    server = RedisServer()
    server.start()
    tmp = tempfile.mkdtemp(prefix="throttle-e2e-")
    try:
        configure(server.url, os.path.join(tmp, "db.sqlite3"), "memory" if args.memory else "redis")
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        run(server, rounds, per_round)
    finally:
        server.close()


def run(server: RedisServer, rounds: int, per_round: int) -> None:
    from django_throttle.store import get_store

    def start_response(status, headers, exc_info=None):
        return None

    make_rules()
    baseline = handler(False)
    throttled = handler(True)
    cases = {"1 rule": environs("/p/"), "5 rules": environs("/api/x/")}
    for envs in cases.values():
        for env in envs[:50]:
            throttled(dict(env), start_response)  # warm: rules loaded, script cached
    store = get_store()
    # The decisions' own connection; with the memory backend, a client of the same server.
    client = getattr(store, "client", None) or server.client()
    raw = client.register_script("return 1")
    raw()
    # The floor: the same EVALSHA on the path the decisions take (redis-py's, for a
    # Sentinel pool or the memory backend, where the store has no connections of its own).
    execute = getattr(store, "execute", client.execute_command)

    def floor() -> object:
        return execute("EVALSHA", raw.sha, 0)

    assert floor() == 1
    samples: dict[str, list[int]] = {
        "raw": [],
        "floor": [],
        "baseline": [],
        "1 rule": [],
        "5 rules": [],
    }
    pc = time.perf_counter_ns
    for _ in range(rounds):
        for i in range(per_round):
            n = i % N_CLIENTS
            t = pc()
            raw()
            samples["raw"].append(pc() - t)
            t = pc()
            floor()
            samples["floor"].append(pc() - t)
            t = pc()
            baseline(dict(cases["1 rule"][n]), start_response)
            samples["baseline"].append(pc() - t)
            for label, envs in cases.items():
                t = pc()
                response = throttled(dict(envs[n]), start_response)
                samples[label].append(pc() - t)
                assert response.status_code == 200, response.status_code
    report(samples)


def report(samples: dict[str, list[int]]) -> None:
    med = {k: statistics.median(v) / 1000 for k, v in samples.items()}
    p99 = {k: sorted(v)[int(len(v) * 0.99)] / 1000 for k, v in samples.items()}
    print(f"{'case':<32}{'median us':>11}{'p99 us':>10}{'added us':>10}{'/ raw':>9}{'/ floor':>9}")
    print(f"{'raw EVALSHA return 1 (redis-py)':<32}{med['raw']:>11.1f}{p99['raw']:>10.1f}")
    print(f"{'EVALSHA return 1, store path':<32}{med['floor']:>11.1f}{p99['floor']:>10.1f}")
    print(f"{'Django, no throttling':<32}{med['baseline']:>11.1f}{p99['baseline']:>10.1f}")
    for label in ("1 rule", "5 rules"):
        added = med[label] - med["baseline"]
        print(
            f"{'ThrottleMiddleware, ' + label:<32}{med[label]:>11.1f}{p99[label]:>10.1f}"
            f"{added:>10.1f}{added / med['raw']:>8.2f}x{added / med['floor']:>8.2f}x"
        )
    print(
        f"samples per case: {len(samples['raw'])}; target: 1 rule added <= 1.5 x raw EVALSHA "
        "(redis-py)"
    )


if __name__ == "__main__":
    main()
