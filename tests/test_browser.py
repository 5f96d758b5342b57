"""A real browser: headless Chromium logs into the admin, reads the dashboard, resets a key.

Needs Debian's ``chromium`` (``apt-get install chromium``) and the ``playwright`` package;
the test is skipped without them, except under CI (``CI`` set), where it fails instead.
The screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import math
import time
from functools import partial
from pathlib import Path

import pytest
from django.contrib.admin.models import LogEntry
from django.test import RequestFactory

from django_throttle import check
from django_throttle.rejection_log import flush, rejection_log
from tests.external import CHROMIUM, require
from tests.helpers import rule

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOP_CLIENT = "203.0.113.7"

pytestmark = pytest.mark.slow


def require_browser() -> None:
    require("browser")


def traffic() -> None:
    """Rejections through check(), and an hour of history through the recorder."""
    rule("login", "login", 3)
    rule("api", "api", 30)
    rule("search-trial", "search", 5, action="log")
    for ip, requests in ((TOP_CLIENT, 15), ("198.51.100.4", 8), ("192.0.2.44", 5)):
        request = partial(RequestFactory().post, "/login/", REMOTE_ADDR=ip)
        for _ in range(requests):
            check(request(), "login")
    for _ in range(40):
        check(RequestFactory().get("/api/", REMOTE_ADDR="192.0.2.10"), "api")
    for _ in range(12):
        check(RequestFactory().get("/search/", REMOTE_ADDR="192.0.2.20"), "search")
    now = time.time()
    for minutes_ago in range(1, 60):  # a steady trickle on login, a burst on the API
        when = now - 60 * minutes_ago
        for n in range(round(4 + 3 * math.sin(minutes_ago / 4))):
            rejection_log().add("login", f"ip:192.0.2.{50 + n % 3}", "reject", when=when)
        for _ in range(9 if 20 <= minutes_ago <= 28 else 0):
            rejection_log().add("api", "ip:192.0.2.10", "reject", when=when)
    flush()


def remaining_of_top_client() -> int | None:
    request = RequestFactory().post("/login/", REMOTE_ADDR=TOP_CLIENT)
    return check(request, "login", dry_run=True).remaining


@pytest.mark.django_db(transaction=True)
def test_dashboard_in_a_real_browser(live_server, django_user_model):
    require_browser()
    from playwright.sync_api import sync_playwright

    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    traffic()
    assert remaining_of_top_client() == 0
    ARTIFACTS.mkdir(exist_ok=True)

    # Only the browser inside this block: Playwright runs an event loop in this thread, and
    # Django refuses database queries there.
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{live_server.url}/admin/login/?next=/admin/django_throttle/dashboard/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", "pw")
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/django_throttle/dashboard/")

            # The chart is drawn: one line per rule, laid out with a real size.
            lines = page.locator("svg.throttle-chart polyline.series")
            assert lines.count() == 3
            chart = page.locator("svg.throttle-chart").bounding_box()
            assert chart is not None and chart["width"] > 600 and chart["height"] > 100
            line = lines.first.bounding_box()
            assert line is not None and line["width"] > 0
            # The stylesheet arrived (served by the live server): the legend is a flex row.
            legend = page.locator(".throttle-legend")
            assert legend.evaluate("e => getComputedStyle(e).display") == "flex"
            # The top-keys table is filled, with the client that was rejected 12 times.
            rows = page.locator("#throttle-top-keys tbody tr")
            assert rows.count() >= 5
            row = rows.filter(has_text=f"ip:{TOP_CLIENT}").filter(has_text="login")
            cells = row.locator("td").all_inner_texts()
            assert cells[:3] == [f"ip:{TOP_CLIENT}", "login", "12"]
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

            # Inspect the top client, then reset it with the button.
            row.get_by_role("link", name="inspect").click()
            page.wait_for_url("**/admin/django_throttle/dashboard/key/**")
            state = page.locator("tr.throttle-state[data-rule=login]")
            assert state.locator(".remaining").inner_text() == "0"
            state.locator("input.throttle-reset").click()
            page.wait_for_selector(".messagelist")
            assert f"Client key ip:{TOP_CLIENT} reset under rule login." in page.inner_text(
                ".messagelist"
            )
            state = page.locator("tr.throttle-state[data-rule=login]")
            assert state.locator(".remaining").inner_text() == "3"
            page.screenshot(path=str(ARTIFACTS / "dashboard-key.png"), full_page=True)
        finally:
            browser.close()

    assert remaining_of_top_client() == 3
    (entry,) = LogEntry.objects.all()
    assert entry.object_repr.startswith("login:")
    assert entry.change_message == f"Reset the state of client key ip:{TOP_CLIENT}."
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000


@pytest.mark.django_db(transaction=True)
def test_block_from_the_top_clients_and_unblock_on_the_key_page(live_server, django_user_model):
    require_browser()
    from playwright.sync_api import sync_playwright

    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    rule("login", "login", 3)
    request = partial(RequestFactory().post, "/login/", REMOTE_ADDR=TOP_CLIENT)
    for _ in range(5):
        check(request(), "login")
    flush()
    ARTIFACTS.mkdir(exist_ok=True)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{live_server.url}/admin/login/?next=/admin/django_throttle/dashboard/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", "pw")
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/django_throttle/dashboard/")

            # Block the top client for a day from its row.
            row = page.locator("#throttle-top-keys tbody tr").filter(has_text=f"ip:{TOP_CLIENT}")
            row.locator("details.throttle-actions summary").click()
            row.locator("select.throttle-block-seconds").select_option("86400")
            page.screenshot(path=str(ARTIFACTS / "dashboard-actions.png"), full_page=True)
            row.locator("input.throttle-block").click()
            page.wait_for_selector(".messagelist")
            assert f"Client key ip:{TOP_CLIENT} blocked for 1 day under rule login." in (
                page.inner_text(".messagelist")
            )
            page.wait_for_url("**/admin/django_throttle/dashboard/")

            # The key page says so; Unblock ends it.
            row = page.locator("#throttle-top-keys tbody tr").filter(has_text=f"ip:{TOP_CLIENT}")
            row.get_by_role("link", name="inspect").click()
            page.wait_for_url("**/admin/django_throttle/dashboard/key/**")
            state = page.locator("tr.throttle-state[data-rule=login]")
            assert "blocked for 86" in state.locator(".throttle-blocked").inner_text()
            state.locator("input.throttle-reset").click()
            page.wait_for_selector(".messagelist")
            assert f"Client key ip:{TOP_CLIENT} reset under rule login." in page.inner_text(
                ".messagelist"
            )
            state = page.locator("tr.throttle-state[data-rule=login]")
            assert state.locator(".remaining").inner_text() == "3"
        finally:
            browser.close()

    assert remaining_of_top_client() == 3
    messages = list(LogEntry.objects.order_by("pk").values_list("change_message", flat=True))
    assert messages == [
        f"Blocked client key ip:{TOP_CLIENT} for 1 day.",
        f"Reset the state of client key ip:{TOP_CLIENT}.",
    ]
