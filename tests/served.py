"""The test project behind a real server (uvicorn, gunicorn) that a test runs as a process:
``serving()`` starts one on a free port; the server imports ``asgi`` or ``wsgi`` from here.

The server reads its rules from the test's own database (THROTTLE_TEST_DATABASE: the
connection settings as JSON; the test must use ``django_db(transaction=True)`` so its rules
are committed) and Redis from REDIS_URL, with ThrottleMiddleware installed after
AuthenticationMiddleware (unless THROTTLE_TEST_MIDDLEWARE is empty) and THROTTLE_TEST_SETTINGS
(JSON) merged into DJANGO_THROTTLE.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATABASE_KEYS = ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serving(
    server: Sequence[str],
    database: dict[str, Any],
    throttle: dict[str, Any] | None = None,
    middleware: bool = True,
    environ: dict[str, str | None] | None = None,
) -> Iterator[int]:
    """Run ``server`` (its command line after ``python -m``, with ``{port}`` in it) until the
    block ends; yields the port once the server answers. ``middleware=False``: without
    ThrottleMiddleware (decorated views only). ``environ``: variables to set, or with None to
    leave unset."""
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "THROTTLE_TEST_DATABASE": json.dumps({k: database.get(k, "") for k in DATABASE_KEYS}),
        "THROTTLE_TEST_SETTINGS": json.dumps(throttle or {}),
        "THROTTLE_TEST_MIDDLEWARE": "1" if middleware else "",
    }
    for name, value in (environ or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    assert env["REDIS_URL"]  # the harness's server, shared with the test
    args = [sys.executable, "-m", *(a.format(port=port) for a in server)]
    process = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _wait_for(port, process)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


@contextmanager
def demo_server(database_dir: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """`manage.py demo` (what scripts/demo runs) on a free port, its SQLite database in
    ``database_dir``, its store the harness's Redis; yields the port once the demo answers,
    and the environment it runs with."""
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DEMO_DATABASE": str(database_dir / "demo.sqlite3"),
    }
    assert env["REDIS_URL"]  # the harness's server: the demo's store is Redis, as in production
    process = subprocess.Popen(
        [sys.executable, "manage.py", "demo", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "the demo exited"
            connection = HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("GET", "/login/")
                connection.getresponse().read()
                break
            except OSError:
                assert time.monotonic() < deadline, "the demo did not start"
                time.sleep(0.2)
            finally:
                connection.close()
        yield port, env
    finally:
        process.terminate()
        process.wait(timeout=10)


def _wait_for(port: int, process: subprocess.Popen[bytes], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read().decode() if process.stderr is not None else ""
            raise AssertionError(f"the server exited: {err}")
        connection = HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            connection.request("GET", "/plain/")
            status = connection.getresponse().status
        except OSError:  # not listening yet, or reset while it starts
            time.sleep(0.05)
            continue
        finally:
            connection.close()  # also when the server reset it: no socket left to the collector
        assert status == 200
        return
    raise AssertionError(f"the server did not answer within {within} s")


def _configure() -> None:
    from django.conf import settings

    database = json.loads(os.environ["THROTTLE_TEST_DATABASE"])
    settings.DATABASES["default"] = {k: v for k, v in database.items() if v}
    if os.environ.get("THROTTLE_TEST_MIDDLEWARE"):
        middleware = list(settings.MIDDLEWARE)
        auth = middleware.index("django.contrib.auth.middleware.AuthenticationMiddleware")
        middleware.insert(auth + 1, "django_throttle.middleware.ThrottleMiddleware")
        settings.MIDDLEWARE = middleware
    extra = json.loads(os.environ.get("THROTTLE_TEST_SETTINGS") or "{}")
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, **extra}


if "THROTTLE_TEST_DATABASE" in os.environ:  # imported by the server, not by a test
    _configure()
    from django.core.asgi import get_asgi_application
    from django.core.wsgi import get_wsgi_application

    asgi = get_asgi_application()
    wsgi = get_wsgi_application()
