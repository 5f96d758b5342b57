"""The pictures of README.md and docs/usage.md: the admin and the dashboard, saved in docs/*.png.

    scripts/screenshots                       # makes .venv as scripts/demo does, then this
    .venv/bin/python scripts/screenshots.py   # with a virtual environment that has the test extra

Starts the example project as scripts/demo does (``manage.py demo``), on a throwaway SQLite
database and a redis-server of its own on a free loopback port; adds a login lockout counting
only 401s, an override of the ``api`` rule that expires, and a rule file to preview; sends
``demo_traffic`` and writes an hour of rejection history through the recorder (as
tests/test_browser.py does), then drives Debian's /usr/bin/chromium through Playwright at
1280 px. Nothing reaches the internet; the database and Redis go away at the end. Not part of
the test suite. PNGs are run through optipng when it is installed.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--font-render-hinting=none",
]
WIDTH = 1280
DASHBOARD = "/admin/django_throttle/dashboard/"
RULES = "/admin/django_throttle/rule/"
TOP_CLIENT = "ip:203.0.113.7"  # the first address of demo_traffic's API burst
TOP_ROWS = "#throttle-top-keys tbody tr:nth-child(6)"  # the pictures end after six clients


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(ready: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{what} did not start within {timeout:.0f} s")


@contextmanager
def running(command: list[str], env: dict[str, str] | None = None) -> Iterator[None]:
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        yield
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def redis_answers(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(16).startswith(b"+PONG")


def http_answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return bool(response.status == 200)


# -- the example project's data, written in this process before the browser starts -----------


LOCKOUT_RULE = {
    "name": "login-lockout",
    "scope": "login",
    "methods": "POST",
    "count_statuses": "401",
    "key_kind": "ip",
    "limit": 5,
    "per": 15,
    "unit": "minute",
    "algorithm": "sliding_window_counter",
    "block_seconds": 3600,
    "fail_mode": "closed",
}


def set_up_project(rule_file: Path) -> dict[str, int]:
    """Seed as ``manage.py demo`` does, add the rules the pictures need, send traffic; the ids
    of the rules by name."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.utils import timezone

    from django_throttle.management.rulefiles import dump, export_rules
    from django_throttle.models import Override, Rule
    from django_throttle.rejection_log import flush, rejection_log

    with open(os.devnull, "w") as quiet:
        call_command("demo", no_server=True, stdout=quiet)
        lockout = Rule.objects.create(**LOCKOUT_RULE)
        soon = timezone.now() + timedelta(days=7)
        Override.objects.create(rule=lockout, key="ip:198.51.100.23", exempt=True, expires_at=soon)
        api = Rule.objects.get(name="api")
        Override.objects.create(rule=api, key="ip:203.0.113.9", limit=60, expires_at=soon)
        call_command("demo_traffic", stdout=quiet)

    # The hour before: a trickle of failed logins, a burst on the API, scrapers on items.
    now = time.time()
    log = rejection_log()
    for minutes_ago in range(1, 60):
        when = now - 60 * minutes_ago
        for n in range(round(3 + 2 * math.sin(minutes_ago / 5))):
            log.add("login-failures", f"ip:192.0.2.{60 + n % 4}", "reject", when=when)
        for _ in range(14 if 18 <= minutes_ago <= 27 else 0):
            log.add("api", TOP_CLIENT, "reject", when=when)
        for _ in range(5 if minutes_ago % 9 < 4 else 0):
            log.add("items", "ip:198.51.100.4", "reject", when=when)
    flush()

    # A rule file to preview: two rules changed, one new, one the file no longer names (prune).
    data = export_rules()
    rules = [r for r in data["rules"] if r["name"] != "export"]
    for entry in rules:
        if entry["name"] == "api":
            entry["limit"] = 30
        if entry["name"] == "login-lockout":
            entry["count_statuses"] = "401,403"
            entry["block_seconds"] = 900
    rules.append(
        {"name": "search", "scope": "search", "key_kind": "user_or_ip", "limit": 60, "per": 1}
    )
    rule_file.write_text(dump({"rules": rules}, "yaml"), encoding="utf-8")
    return {rule.name: int(rule.pk) for rule in Rule.objects.all()}


# -- the browser ------------------------------------------------------------------------------


def save(page: Any, name: str, bottom_of: str | None = None, margin: int = 16) -> Path:
    """A screenshot of the page from its top to the bottom of ``bottom_of`` (else all of it),
    taken with a window that tall: the admin's sidebar fills the window, not the page."""
    path = DOCS / name
    page.evaluate("window.scrollTo(0, 0)")
    if bottom_of is None:
        height = page.evaluate("document.documentElement.scrollHeight")
    else:
        box = page.locator(bottom_of).bounding_box()
        height = box["y"] + box["height"] + margin
    page.set_viewport_size({"width": WIDTH, "height": math.ceil(height)})
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": WIDTH, "height": 900})
    if shutil.which("optipng"):
        subprocess.run(["optipng", "-quiet", "-o2", str(path)], check=True)
    print(f"{path.relative_to(ROOT)}: {path.stat().st_size // 1024} kB")
    return path


def log_in(page: Any, base: str, then: str) -> None:
    page.goto(f"{base}/admin/login/?next={then}")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "admin")
    page.click("input[type=submit]")
    page.wait_for_url(f"**{then}")


def open_act_menu(page: Any) -> None:
    row = page.locator("#throttle-top-keys tbody tr").filter(has_text=TOP_CLIENT).first
    row.locator("details.throttle-actions summary").click()
    row.locator("select.throttle-block-seconds").select_option("3600")


def photograph(base: str, rules: dict[str, int], rule_file: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            viewport = {"width": WIDTH, "height": 900}
            english = browser.new_context(viewport=viewport, locale="en-US")
            page = english.new_page()
            log_in(page, base, DASHBOARD)

            # The dashboard: chart, totals, the top clients with one Act menu open.
            open_act_menu(page)
            save(page, "dashboard.png", bottom_of=TOP_ROWS, margin=1)

            # The key page of the top client under two rules: blocked for an hour under api.
            query = urlencode(
                [("rule", rules["api"]), ("rule", rules["site"]), ("key", TOP_CLIENT)]
            )
            page.goto(f"{base}{DASHBOARD}key/?{query}")
            state = page.locator("tr.throttle-state[data-rule=api]")
            state.locator("select.throttle-block-seconds").select_option("3600")
            state.locator("input.throttle-block").click()
            page.wait_for_selector(".messagelist")
            save(page, "dashboard-key.png", bottom_of="#throttle-key-state")

            # The rule form of the login lockout: compact, the rule in words at the top.
            page.goto(f"{base}{RULES}{rules['login-lockout']}/change/")
            page.wait_for_selector(".field-in_words")
            save(page, "rule-form.png")

            # The import page's dry-run diff.
            page.goto(f"{base}{RULES}import/")
            page.set_input_files("#id_file", str(rule_file))
            page.check("#id_prune")
            page.click("input[name=_preview]")
            page.wait_for_selector("#throttle-import-changed")
            save(page, "rule-import.png", bottom_of="#throttle-import-apply")

            # The dashboard in Korean: the browser asks for it (Accept-Language: ko-KR).
            korean = browser.new_context(
                viewport=viewport, locale="ko-KR", storage_state=english.storage_state()
            )
            page = korean.new_page()
            page.goto(f"{base}{DASHBOARD}")
            open_act_menu(page)
            save(page, "dashboard-ko.png", bottom_of=TOP_ROWS, margin=1)
        finally:
            browser.close()


def main() -> None:
    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"{CHROMIUM} is needed: apt-get install chromium")
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        raise SystemExit("redis-server is needed: apt-get install redis-server")
    korean = subprocess.run(["fc-list", ":lang=ko"], capture_output=True, text=True).stdout
    if not korean.strip():
        raise SystemExit(
            "a Korean font is needed for docs/dashboard-ko.png: apt-get install fonts-nanum"
        )
    with tempfile.TemporaryDirectory(prefix="throttle-shots-") as tmp:
        redis_port, web_port = free_port(), free_port()
        os.environ.update(
            DJANGO_SETTINGS_MODULE="example_project.settings",
            DEMO_DATABASE=str(Path(tmp) / "demo.sqlite3"),
            REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
            DJANGO_DEBUG="1",  # runserver serves the admin's static files
        )
        sys.path.insert(0, str(ROOT))
        redis = [redis_server, "--port", str(redis_port), "--bind", "127.0.0.1"]
        redis += ["--save", "", "--appendonly", "no", "--dir", tmp]
        with running(redis):
            wait_until(lambda: redis_answers(redis_port), "redis-server")
            rule_file = Path(tmp) / "rules.yaml"
            rules = set_up_project(rule_file)
            base = f"http://127.0.0.1:{web_port}"
            server = [sys.executable, "manage.py", "demo", f"127.0.0.1:{web_port}"]
            with running(server, env=dict(os.environ)):
                wait_until(lambda: http_answers(f"{base}/admin/login/"), "the demo server")
                photograph(base, rules, rule_file)


if __name__ == "__main__":
    main()
