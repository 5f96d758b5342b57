"""The login lockout of docs/usage.md, run as written: its view, template and rule file are
tests/recipes/login_site/, kept identical to the blocks of the docs."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from django_throttle.models import Rule

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "tests" / "recipes" / "login_site"
RECIPE = {
    "accounts/urls.py": ("python", SITE / "accounts" / "urls.py"),
    "accounts/templates/registration/login.html": (
        "html+django",
        SITE / "accounts" / "templates" / "registration" / "login.html",
    ),
    "login-failures.yaml": ("yaml", SITE / "login-failures.yaml"),
}

pytestmark = pytest.mark.django_db


def test_the_recipes_blocks_are_the_files_the_tests_run() -> None:
    usage = (ROOT / "docs" / "usage.md").read_text()
    for name, (language, file) in RECIPE.items():
        opening = "{#" if language == "html+django" else "#"
        found = re.findall(
            rf"```{re.escape(language)}\n({opening} {re.escape(name)}\b.*?)```", usage, re.S
        )
        assert found == [file.read_text()], name


@pytest.fixture
def site(settings: Any) -> Client:
    """A project as the recipe has it: ThrottleMiddleware after the authentication, the app
    ``accounts`` installed (its template found by APP_DIRS), its URLs, its rule imported."""
    auth = settings.MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware")
    settings.MIDDLEWARE = [
        *settings.MIDDLEWARE[: auth + 1],
        "django_throttle.middleware.ThrottleMiddleware",
        *settings.MIDDLEWARE[auth + 1 :],
    ]
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "tests.recipes.login_site.accounts"]
    settings.ROOT_URLCONF = "tests.recipes.login_site.accounts.urls"
    call_command("throttle_import", str(SITE / "login-failures.yaml"), stdout=StringIO())
    User.objects.create_user("alice", password="right horse")
    return Client(REMOTE_ADDR="203.0.113.7")


def log_in(client: Client, password: str) -> int:
    return client.post("/login/", {"username": "alice", "password": password}).status_code


def test_the_form_shows_and_the_right_password_logs_in(site: Client) -> None:
    page = site.get("/login/")
    assert page.status_code == 200
    assert b'name="password"' in page.content and b"csrfmiddlewaretoken" in page.content
    assert log_in(site, "right horse") == 302  # before any failure: in, and nothing counted


def test_five_wrong_passwords_lock_the_client_out_for_an_hour(site: Client) -> None:
    assert Rule.objects.get(name="login-failures").count_statuses == "401"
    assert log_in(site, "right horse") == 302  # a success counts nothing
    assert [log_in(site, "wrong") for _ in range(5)] == [401] * 5
    locked = site.post("/login/", {"username": "alice", "password": "right horse"})
    assert locked.status_code == 429  # the right password too: the client is locked out
    assert 3500 < int(locked["Retry-After"]) <= 3600  # the rule's block, not the window
    assert site.get("/login/").status_code == 200  # showing the form is not an attempt
