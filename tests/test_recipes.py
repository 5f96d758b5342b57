"""The recipes of docs/usage.md, run as written. Every block a reader would paste as a file
opens with a comment naming it and is a file under tests/ that a test runs, kept identical to
the block; every other block is a fragment listed below, with where it goes, and the cheap
ones are run too. The tests of an optional extra's recipe are with that extra's tests
(test_celery.py, test_channels.py, test_ninja.py, test_strawberry.py, test_metrics.py)."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client, RequestFactory

from django_throttle import check_key
from django_throttle.models import Ban, Override, Rule
from tests.helpers import away_from_midnight, rule

ROOT = Path(__file__).resolve().parent.parent
USAGE = ROOT / "docs" / "usage.md"
SITE = ROOT / "tests" / "recipes" / "login_site"
RECIPES = ROOT / "tests" / "recipes"

# The first line of each block a reader pastes as a file, and the file the tests run.
FILES = {
    "# login-failures.yaml: python manage.py throttle_import login-failures.yaml": (
        SITE / "login-failures.yaml"
    ),
    '# accounts/urls.py: include it in the project\'s urls.py, path("accounts/", '
    'include("accounts.urls")).': SITE / "accounts" / "urls.py",
    "{# accounts/templates/registration/login.html: the template LoginView renders #}": (
        SITE / "accounts" / "templates" / "registration" / "login.html"
    ),
    '# accounts/views.py: the login lockout counted in the view, under the rules of "failed-login"': (
        SITE / "accounts" / "views.py"
    ),
    "# orders/partners.py: the partner's API, posting an order as JSON": (
        ROOT / "tests" / "celery_orders" / "partners.py"
    ),
    "# orders/tasks.py: acquire() waits in the worker for a turn": (
        ROOT / "tests" / "celery_orders" / "acquire_tasks.py"
    ),
    "# orders/tasks.py": ROOT / "tests" / "celery_orders" / "tasks.py",
    "# chat/llm.py: a stand-in for your model's client, streaming the prompt's words back": (
        RECIPES / "chat_site" / "chat" / "llm.py"
    ),
    "# chat/views.py": RECIPES / "chat_site" / "chat" / "views.py",
    "# chat/tasks.py: the completion made in a Celery task, charged to its user afterwards": (
        RECIPES / "chat_site" / "chat" / "tasks.py"
    ),
    "# urls.py: the project's URLs, with the status endpoint": RECIPES / "status_site" / "urls.py",
    "# budget.py: wait until every rule on a path has a request left": (
        RECIPES / "status_site" / "budget.py"
    ),
    "# schema.py: a schema whose operations are counted by their cost": (
        RECIPES / "graphql_site" / "schema.py"
    ),
    '# asgi.py: the whole file of a project "mysite" with the app "chat" (chat/routing.py below).': (
        RECIPES / "chat_site" / "asgi.py"
    ),
    "# chat/routing.py: a chat whose handshakes and messages are limited by admin rules.": (
        RECIPES / "chat_site" / "chat" / "routing.py"
    ),
    '# api.py: an API whose URLs are path("api/", api.urls) in urls.py': (
        RECIPES / "ninja_site" / "api.py"
    ),
    "# urls.py: the project's URLs, with a view of its own for /metrics": (
        RECIPES / "metrics_site" / "urls.py"
    ),
    "# rules.yaml: python manage.py throttle_import rules.yaml": RECIPES / "rules.yaml",
}

# The first line of each fragment: code shown in passing, which the prose places in a file of
# the reader's (or that needs what only the reader has: a queue, django-prometheus).
FRAGMENTS = {
    "from django.utils.decorators import method_decorator": "the decorator's uses, run below",
    "Rule.objects.create(": "rules made in code (a shell, a migration), run below",
    "from django_throttle import acquire, check_key, refund_key": "calls, run below",
    "from django_throttle import acquire": "a consumer of the reader's own queue",
    "from django_throttle import block_key, reset": "calls, run below",
    'DJANGO_THROTTLE = {"KEY_FUNCTIONS": {"tenant": "myapp.keys.tenant"}}': "settings, run below",
    "MIDDLEWARE = [": "settings: the order of the project's middleware",
    "from datetime import timedelta": "bans made in code, run below",
    'REST_FRAMEWORK = {"DEFAULT_THROTTLE_CLASSES": ["django_throttle.contrib.drf.RuleThrottle"]}': (
        "settings and a DRF view's attribute (test_status.py, test_spectacular.py run DRF)"
    ),
    "SPECTACULAR_SETTINGS = {": "settings, run below",
    "# settings.py": "django-prometheus's settings and URLs (not a dependency of the tests)",
    "scrape_configs:": "Prometheus's configuration, not Django's",
}

pytestmark = pytest.mark.django_db


def blocks() -> list[tuple[str, str]]:
    """(language, text) of every block of code a reader might paste."""
    found = re.findall(r"```(python|yaml|html\+django)\n(.*?)```", USAGE.read_text(), re.S)
    return [(language, text) for language, text in found]


def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def test_every_block_is_a_file_the_tests_run_or_a_listed_fragment() -> None:
    seen: dict[str, int] = {}
    fragments_seen = set()
    for _, text in blocks():
        head = first_line(text)
        if head in FILES:
            assert text == FILES[head].read_text(), head
            seen[head] = seen.get(head, 0) + 1
        else:
            assert head in FRAGMENTS, f"a block neither tied to a file nor a fragment: {head}"
            fragments_seen.add(head)
    assert seen == dict.fromkeys(FILES, 1)  # each file is one block, once
    assert fragments_seen == set(FRAGMENTS)  # no fragment listed that the docs lost


def fragments(head: str) -> list[str]:
    return [text for _, text in blocks() if first_line(text) == head]


# -- the login lockout by count_statuses: accounts/urls.py, its template, its rule -----------


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


# -- the login lockout counted in the view: accounts/views.py --------------------------------


@pytest.fixture
def view_site(settings: Any) -> Client:
    """The view of the recipe, its template from the app ``accounts``, and the rule it names:
    "failed-login", 5 per 15 minutes per address."""
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "tests.recipes.login_site.accounts"]
    settings.ROOT_URLCONF = "tests.recipes.urls"
    rule("failed-login", "failed-login", 5, per=15, algorithm="sliding_window_log")
    User.objects.create_user("alice", password="right horse")
    return Client(REMOTE_ADDR="203.0.113.8")


def test_the_view_counts_each_attempt_and_gives_a_right_password_back(view_site: Client) -> None:
    assert [view_site.get("/login/").status_code for _ in range(6)] == [200] * 6  # not attempts
    assert log_in(view_site, "right horse") == 302  # given back
    assert [log_in(view_site, "wrong") for _ in range(5)] == [401] * 5
    locked = view_site.post("/login/", {"username": "alice", "password": "right horse"})
    assert locked.status_code == 429 and b"Too many failed logins" in locked.content
    assert check_key("failed-login", "ip:203.0.113.8", dry_run=True).remaining == 0
    assert (
        Client(REMOTE_ADDR="203.0.113.9")
        .post(  # another address is not locked out
            "/login/", {"username": "alice", "password": "right horse"}
        )
        .status_code
        == 302
    )


# -- LLM tokens: chat/llm.py and chat/views.py (chat/tasks.py: test_celery.py) ---------------


def test_a_completion_is_charged_the_tokens_it_streamed(
    settings: Any, throttle_middleware: None
) -> None:
    settings.ROOT_URLCONF = "tests.recipes.urls"
    rule("chat-tokens", "/chat/", 10, key_kind="user", unit="day", algorithm="fixed_window")
    away_from_midnight()
    user = User.objects.create_user("bob")
    client = Client()
    client.force_login(user)
    prompt = "one two three four five six seven eight"

    def stream() -> Any:
        response = client.post("/chat/", {"prompt": prompt})
        return response, b"".join(response.streaming_content)  # ends and closes the stream

    first, text = stream()
    assert first.status_code == 200 and text == f"{prompt} ".encode()  # the stand-in's echo
    assert check_key("/chat/", f"user:{user.pk}", dry_run=True).remaining == 2  # 8 tokens
    second, _ = stream()  # started with budget left: never cut off, charged past the limit
    assert second.status_code == 200
    spent = client.post("/chat/", {"prompt": "hi"})
    assert spent.status_code == 429 and int(spent["Retry-After"]) >= 1


# -- the status endpoint and a client that waits for its budget: status_site/ ----------------


@pytest.mark.urls("tests.recipes.status_site.urls")
def test_the_status_endpoint_answers_for_a_path_and_method() -> None:
    rule("orders", "/api/orders/", 60, methods="POST", algorithm="fixed_window")
    answer = Client().get("/throttle/status/", {"path": "/api/orders/", "method": "POST"})
    assert answer.status_code == 200
    (orders,) = answer.json()["rules"]
    assert (orders["name"], orders["limit"], orders["remaining"]) == ("orders", 60, 60)
    assert orders["policy"] == '"orders";q=60;w=60'


@pytest.mark.django_db(transaction=True)
def test_the_client_waits_until_its_budget_is_back(
    live_server: Any, settings: Any, throttle_middleware: None
) -> None:
    """The client asks a real server (the status endpoint needs no middleware); its requests
    are spent through the test client, from the same address, 127.0.0.1."""
    from tests.recipes.status_site.budget import wait_for_budget

    settings.ROOT_URLCONF = "tests.recipes.status_site.urls"
    rule("orders", "/api/orders/", 2, unit="second", algorithm="sliding_window_log")
    client = Client(REMOTE_ADDR="127.0.0.1")
    # No view: 404s, which the rule counts as any request.
    assert [client.get("/api/orders/").status_code for _ in range(3)] == [404, 404, 429]
    wait_for_budget(live_server.url.replace("localhost", "127.0.0.1"), "/api/orders/")
    assert client.get("/api/orders/").status_code == 404  # admitted again


# -- the rule file of "Rules as files" --------------------------------------------------------


def test_the_rule_file_imports_as_written() -> None:
    out = StringIO()
    call_command("throttle_import", str(RECIPES / "rules.yaml"), stdout=out)
    assert out.getvalue().split("\n")[:2] == ["create api", "create login"]
    api = Rule.objects.get(name="api")
    assert (api.limit, api.per, api.unit, api.exempt_networks) == (100, 15, "minute", "10.0.0.0/8")
    assert sorted(Override.objects.values_list("key", "limit", "exempt")) == [
        ("ip:203.0.113.7", None, True),
        ("user:42", 1000, False),
    ]
    assert Rule.objects.get(name="login").count_statuses == "401"


# -- fragments: each runs where the prose puts it ---------------------------------------------


def test_the_decorators_uses_apply() -> None:
    from django_throttle.rules.defaults import Registry
    from django_throttle.runtime import runtime

    (code,) = fragments("from django.utils.decorators import method_decorator")
    registry = runtime().part(Registry)
    before = {scope: list(defaults) for scope, defaults in registry.defaults.items()}
    views: dict[str, Any] = {}
    try:
        exec(code, views)  # a bad rate, cost or count_statuses raises here, as the docs say
        added = [d for d in registry.defaults["search"] if d not in before.get("search", [])]
        assert [(d.key, d.algorithm) for d in added] == [("user_or_ip", "sliding_window_counter")]
    finally:  # code defaults outlive a test: the block's must not meet the next ones
        with registry.lock:
            registry.defaults = before
    assert {"login_view", "search", "export", "upload", "report", "login", "Orders"} <= set(views)


def test_rules_made_in_code_save() -> None:
    made = fragments("Rule.objects.create(")
    for number, code in enumerate(made):
        Rule.objects.all().delete()
        exec(code, {"Rule": Rule})
        assert Rule.objects.count() == 1, number
    assert len(made) == 3


def test_calls_without_a_request_count_and_block() -> None:
    rule("partner-api", "partner-api", 10, unit="second", algorithm="fixed_window")
    rule("login", "login", 5, per=15)
    (calls,) = fragments("from django_throttle import acquire, check_key, refund_key")
    namespace: dict[str, Any] = {}
    exec(calls, namespace)
    assert namespace["decision"].allowed
    assert check_key("partner-api", "partner:acme", dry_run=True).remaining == 9  # 2 - 1
    (blocks_code,) = fragments("from django_throttle import block_key, reset")
    exec(blocks_code, {})
    assert not check_key("login", "ip:203.0.113.7", dry_run=True).allowed  # blocked
    assert check_key("partner-api", "partner:acme", dry_run=True).allowed  # let back in


def test_bans_made_in_code_save() -> None:
    (code,) = fragments("from datetime import timedelta")
    exec(code, {})
    assert sorted(Ban.objects.values_list("key", flat=True)) == ["ip:198.51.100.0/24", "user:42"]


def test_a_key_function_of_the_settings_keys_by_its_header() -> None:
    (code,) = fragments('DJANGO_THROTTLE = {"KEY_FUNCTIONS": {"tenant": "myapp.keys.tenant"}}')
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    assert namespace["DJANGO_THROTTLE"]["KEY_FUNCTIONS"] == {"tenant": "myapp.keys.tenant"}
    request = RequestFactory().get("/", HTTP_X_TENANT="acme")
    assert namespace["tenant"](request) == "acme"
    assert namespace["tenant"](RequestFactory().get("/")) is None


def test_the_schema_hook_of_the_settings_is_importable() -> None:
    from django.utils.module_loading import import_string

    (code,) = fragments("SPECTACULAR_SETTINGS = {")
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    hooks = namespace["SPECTACULAR_SETTINGS"]["POSTPROCESSING_HOOKS"]
    assert all(callable(import_string(hook)) for hook in hooks)
