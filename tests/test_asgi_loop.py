"""Under ASGI the middleware gathers on the event loop, without a thread hop, when nothing it
needs can query the database (fresh rules; ip, header, param and global keys); else in a
thread, as Django requires."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.core.handlers.asgi import ASGIHandler

from tests.helpers import rule, run, where_gathered
from tests.traffic import asgi_get, database_kept_open

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("throttle_middleware"),
]


def requests(paths: list[str], loop_thread: list[int]) -> list[Any]:
    async def body() -> list[Any]:
        loop_thread.append(threading.get_ident())
        with database_kept_open():
            app = ASGIHandler()
            return [(await asgi_get(app, path))[0] for path in paths]

    return list(run(body))


def test_an_ip_rule_is_gathered_on_the_loop(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    # Fresh for the whole test, however slow the machine: a refresh due between the first
    # request's load and its gathering would send that gathering to a thread.
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "RULES_REFRESH": 60.0}
    rule("api", "/api/", 2, algorithm="fixed_window")
    places, loop = where_gathered(monkeypatch)
    statuses = requests(["/api/items/"] * 4, loop)
    assert statuses == [200, 200, 429, 429]
    # The first request loads the rules (a database query) in a thread, when the middleware
    # looks for bans before the view; every gathering then finds them fresh, on the loop.
    assert set(places) == {"loop"}


def test_a_user_rule_whose_user_is_not_loaded_is_gathered_in_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rule("users", "/api/", 2, key_kind="user_or_ip", algorithm="fixed_window")
    places, loop = where_gathered(monkeypatch)
    assert requests(["/api/items/"] * 3, loop) == [200, 200, 429]
    assert set(places) == {"thread"}


def test_a_custom_key_function_is_called_in_a_thread(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    rule("tenants", "/api/", 2, key_kind="custom", key_arg="tenant", algorithm="fixed_window")
    places, loop = where_gathered(monkeypatch)
    assert requests(["/api/items/"] * 3, loop) == [200] * 3  # no X-Tenant: not counted
    assert set(places) == {"thread"}
