"""The example project as ``scripts/demo`` serves it (``manage.py demo``: Daphne's runserver,
the demo's seeded rules, the harness's Redis), driven over real sockets."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from http.client import HTTPConnection
from io import StringIO
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.core.management import call_command

from django_throttle.models import Rule
from tests.external import SPECTRAL, require
from tests.served import demo_server

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """The demo's port and environment (its own database in ``tmp_path``)."""
    with demo_server(tmp_path) as running:
        yield running


def get(port: int, path: str) -> tuple[int, str]:
    """The status and the CSRF cookie's value of a GET."""
    connection = HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        cookies = response.msg.get_all("Set-Cookie") or []
    finally:
        connection.close()
    token = next(
        (c.split(";")[0].split("=", 1)[1] for c in cookies if c.startswith("csrftoken=")), ""
    )
    return response.status, token


def wrong_login(port: int, token: str) -> int:
    body = urlencode({"username": "admin", "password": "wrong", "csrfmiddlewaretoken": token})
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "Cookie": f"csrftoken={token}",
    }
    connection = HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/login/", body, headers)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def rejections(env: dict[str, str]) -> int:
    """What the demo's database holds for its login rule once every process's counts are in."""
    subprocess.run(
        [sys.executable, "manage.py", "throttle_flush"],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    # closing(): sqlite3's own context manager commits but leaves the connection open.
    with closing(sqlite3.connect(env["DEMO_DATABASE"])) as database:
        (count,) = database.execute(
            "SELECT COALESCE(SUM(count), 0) FROM django_throttle_rejection"
            " WHERE rule = 'login-failures' AND action = 'reject'"
        ).fetchone()
    return int(count)


@pytest.mark.slow
def test_parallel_wrong_logins_let_exactly_the_limit_through_and_are_logged(
    demo: tuple[int, dict[str, str]],
) -> None:
    port, env = demo
    status, token = get(port, "/login/")
    assert status == 200 and token
    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = sorted(pool.map(lambda _: wrong_login(port, token), range(12)))
    # Five reach the view (a wrong password: 401); the others are refused before it.
    assert answers == [401] * 5 + [429] * 7
    deadline = time.monotonic() + 20
    while (logged := rejections(env)) < 7 and time.monotonic() < deadline:
        time.sleep(0.5)  # each process hands its counts to Redis every second
    assert logged == 7


@pytest.mark.django_db
def test_the_demo_replaces_the_login_rule_earlier_versions_seeded(settings: Any) -> None:
    from example_project.demo.management.commands.demo import Command

    keys = {
        **settings.DJANGO_THROTTLE["KEY_FUNCTIONS"],
        "api_key": "example_project.demo.keys.api_key",
    }
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "KEY_FUNCTIONS": keys}

    # What ``manage.py demo`` seeded before: a rule only the old view's check() counted.
    Rule.objects.create(name="failed-login", scope="failed-login", limit=5, unit="minute")
    call_command(Command(), no_server=True, stdout=StringIO())
    assert not Rule.objects.filter(name="failed-login").exists()
    assert Rule.objects.get(name="login-failures").count_statuses == "401"


def get_json(port: int, path: str) -> tuple[int, Any, Any]:
    """The status, headers (read in any case) and JSON body of a GET."""
    connection = HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path, headers={"Accept": "application/json"})
        response = connection.getresponse()
        body = json.loads(response.read())
        return response.status, response.msg, body
    finally:
        connection.close()


def post_json(port: int, path: str, data: Any) -> tuple[int, Any, Any]:
    """The status, headers and JSON body of a POST of ``data`` as JSON."""
    connection = HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(
            "POST", path, json.dumps(data), headers={"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        return response.status, response.msg, json.loads(response.read())
    finally:
        connection.close()


def spectral(schema: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    """What Spectral's OWASP rate-limit rules (tests/spectral/rate-limits.yaml) find in a schema."""
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    ruleset = ROOT / "tests" / "spectral" / "rate-limits.yaml"
    report = tmp_path / "findings.json"
    done = subprocess.run(
        [str(SPECTRAL), "lint", "-r", str(ruleset), "-f", "json", "-o", str(report), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 1: it found something
    found: list[dict[str, Any]] = json.loads(report.read_text())
    return found


@pytest.mark.slow
def test_the_demo_s_schemas_pass_the_owasp_rate_limit_rules(
    demo: tuple[int, dict[str, str]], tmp_path: Path
) -> None:
    require("spectral")
    port, _ = demo
    for url in ("/api/schema/?format=json", "/ninja/openapi.json"):
        schema = get_json(port, url)[2]
        covered = [
            (path, method)
            for path, item in schema["paths"].items()
            for method, operation in item.items()
            if isinstance(operation, dict) and "x-ratelimit" in operation
        ]
        assert covered, url
        assert spectral(schema, tmp_path) == [], url
        # The rules do look: an operation without its 429 is found out.
        path, method = covered[0]
        del schema["paths"][path][method]["responses"]["429"]
        codes = {finding["code"] for finding in spectral(schema, tmp_path)}
        assert "owasp:api4:2023-rate-limit-responses-429" in codes, url


@pytest.mark.slow
def test_the_demo_serves_its_status_endpoint_ninja_api_and_schemas(
    demo: tuple[int, dict[str, str]],
) -> None:
    port, _ = demo
    assert get_json(port, "/api/items/")[0] == 200
    status, _, body = get_json(port, "/throttle/status/?path=/api/items/")
    assert status == 200
    rules = {rule["name"]: rule for rule in body["rules"]}
    assert set(rules) == {"site", "api"}  # "api-clients" only logs
    assert (rules["api"]["limit"], rules["api"]["remaining"]) == (20, 19)
    assert get_json(port, "/throttle/status/?method=BREW")[0] == 400

    status, headers, items = get_json(port, "/ninja/items")
    assert status == 200 and len(items) == 10
    assert headers["RateLimit-Policy"].startswith('"')
    assert get_json(port, "/ninja/items/7")[2]["id"] == 7  # the async operation
    ninja = get_json(port, "/ninja/openapi.json")[2]["paths"]
    limits = ninja["/ninja/items"]["get"]["x-ratelimit"]
    assert {"name": "ninja", "limit": 30, "period": 60} in limits
    assert "Retry-After" in ninja["/ninja/items"]["get"]["responses"]["429"]["headers"]

    status, headers, answer = post_json(
        port, "/graphql/", {"query": "{ items(first: 20) { id name } }"}
    )
    assert status == 200 and len(answer["data"]["items"]) == 20
    assert headers["RateLimit"].startswith('"graphql";r=459;')  # 500 - (1 + 20 x 2)

    drf = get_json(port, "/api/schema/?format=json")[2]["paths"]
    orders = drf["/orders/"]["get"]
    assert {"name": "orders", "limit": 10, "period": 60} in orders["x-ratelimit"]
    assert "429" in orders["responses"]
