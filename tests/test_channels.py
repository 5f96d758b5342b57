"""Django Channels: handshakes through ThrottleMiddleware in the real stack (AuthMiddlewareStack,
URLRouter, a real redis-server, rules from the database), messages through
ThrottledConsumerMixin, and a refused handshake over a real ASGI server."""

from __future__ import annotations

import json
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from channels.auth import AuthMiddlewareStack
from channels.generic.websocket import (
    AsyncWebsocketConsumer,
    JsonWebsocketConsumer,
    WebsocketConsumer,
)
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.urls import path

from django_throttle.contrib.channels import ThrottledConsumerMixin, ThrottleMiddleware
from django_throttle.models import Override, Rejection
from django_throttle.rejection_log import flush
from django_throttle.signals import request_throttled
from tests.helpers import rule, run, where_gathered
from tests.redis_server import RedisServer
from tests.served import demo_server, serving
from tests.traffic import database_kept_open

pytestmark = pytest.mark.django_db(transaction=True)

CLIENT = "203.0.113.7"
OTHER = "198.51.100.9"
DENIAL = {"websocket.http.response": {}}
connected: list[str] = []  # the consumers' connect() calls of the current test


class Echo(WebsocketConsumer):
    def connect(self) -> None:
        connected.append(self.scope["path"])
        self.accept()

    def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        self.send(text_data=f"echo:{text_data}")


class SyncChat(ThrottledConsumerMixin, WebsocketConsumer):
    throttle_scope = "chat"
    throttle_close_after = 3

    def connect(self) -> None:
        self.accept()

    def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        self.send(text_data=f"echo:{text_data}")


class JsonChat(ThrottledConsumerMixin, JsonWebsocketConsumer):
    throttle_scope = "chat"

    def connect(self) -> None:
        self.accept()

    def receive_json(self, content: Any, **kwargs: Any) -> None:
        self.send_json({"echo": content})


class AsyncChat(ThrottledConsumerMixin, AsyncWebsocketConsumer):
    throttle_scope = "chat"
    throttle_close_after = 3

    async def connect(self) -> None:
        await self.accept()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.send(text_data=f"echo:{text_data}")

    def throttle_cost(self, text_data: str | None = None, bytes_data: bytes | None = None) -> int:
        return 0 if text_data == "ping" else 2 if text_data == "heavy" else 1


class QuietChat(AsyncChat):
    async def throttled(self, decision: Any) -> None:
        await self.send(text_data=f"slow down: {decision.rule}")


application = AuthMiddlewareStack(
    ThrottleMiddleware(
        URLRouter(
            [
                path("ws/echo/", Echo.as_asgi()),
                path("ws/sync/", SyncChat.as_asgi()),
                path("ws/json/", JsonChat.as_asgi()),
                path("ws/async/", AsyncChat.as_asgi()),
                path("ws/quiet/", QuietChat.as_asgi()),
            ]
        )
    )
)


@pytest.fixture(autouse=True)
def _connected() -> Iterator[None]:
    connected.clear()
    with database_kept_open():
        yield


def communicator(
    path: str,
    client: str = CLIENT,
    headers: list[tuple[bytes, bytes]] | None = None,
    app: Any = application,
) -> WebsocketCommunicator:
    talk = WebsocketCommunicator(app, path, headers=headers)
    talk.scope["client"] = (client, 50000)  # the scope the application was given
    return talk


async def handshake(path: str, **kwargs: Any) -> bool:
    talk = communicator(path, **kwargs)
    accepted, _ = await talk.connect()
    if accepted:
        await talk.disconnect()
    return bool(accepted)


def handshakes(path: str, times: int, **kwargs: Any) -> list[bool]:
    async def body() -> list[bool]:
        return [await handshake(path, **kwargs) for _ in range(times)]

    return list(run(body))


async def denied(path: str, extensions: dict[str, Any] | None) -> list[dict[str, Any]]:
    """What the application sends to the handshake of ``path`` (a refused one: its answer)."""
    scope = {
        "type": "websocket",
        "path": path,
        "query_string": b"",
        "headers": [],
        "subprotocols": [],
        "client": (CLIENT, 50000),
        "extensions": extensions,
    }
    talk = ApplicationCommunicator(application, scope)
    await talk.send_input({"type": "websocket.connect"})
    sent = [await talk.receive_output(2)]
    if sent[0]["type"] == "websocket.http.response.start":
        sent.append(await talk.receive_output(2))
    await talk.wait(2)
    return sent


# Handshakes


def test_handshakes_over_the_limit_are_refused_before_the_consumer_runs() -> None:
    rule("sockets", "/ws/", 2, algorithm="fixed_window")
    assert handshakes("/ws/echo/", 4) == [True, True, False, False]
    assert connected == ["/ws/echo/"] * 2
    assert handshakes("/ws/echo/", 1, client=OTHER) == [True]  # keyed by the client's address


def test_path_rules_select_handshakes_as_they_select_requests() -> None:
    rule("chat-paths", r"^/ws/sync/$", 1, algorithm="fixed_window")
    assert handshakes("/ws/echo/", 2) == [True, True]  # the regex names another path
    assert handshakes("/ws/sync/", 2) == [True, False]


def test_a_rule_for_other_methods_does_not_count_handshakes() -> None:
    rule("posts", "*", 1, methods="POST", algorithm="fixed_window")
    assert handshakes("/ws/echo/", 3) == [True, True, True]


def test_a_rule_naming_websocket_counts_handshakes() -> None:
    rule("sockets", "*", 1, methods="POST,WEBSOCKET", algorithm="fixed_window")
    assert handshakes("/ws/echo/", 2) == [True, False]


def test_the_denial_response_is_a_429_with_the_rate_limit_headers() -> None:
    rule("sockets", "/ws/", 1, algorithm="fixed_window")
    assert handshakes("/ws/echo/", 1) == [True]
    start, body = run(lambda: denied("/ws/echo/", DENIAL))
    assert start["type"] == "websocket.http.response.start" and start["status"] == 429
    headers = {name.decode(): value.decode() for name, value in start["headers"]}
    assert 1 <= int(headers["retry-after"]) <= 60
    assert headers["x-ratelimit-limit"] == "1" and headers["x-ratelimit-remaining"] == "0"
    assert headers["ratelimit-policy"] == '"sockets";q=1;w=60'
    assert headers["content-type"] == "application/json"
    assert body["type"] == "websocket.http.response.body"
    assert json.loads(body["body"])["retry_after"] == int(headers["retry-after"])
    assert connected == ["/ws/echo/"]


def test_without_the_denial_extension_a_refused_handshake_is_closed() -> None:
    rule("sockets", "/ws/", 1, algorithm="fixed_window")
    assert handshakes("/ws/echo/", 1) == [True]
    assert run(lambda: denied("/ws/echo/", None)) == [{"type": "websocket.close"}]


def test_overrides_and_exempt_networks_apply_to_handshakes() -> None:
    sockets = rule("sockets", "/ws/", 1, algorithm="fixed_window", exempt_networks=OTHER)
    Override.objects.create(rule=sockets, key=f"ip:{CLIENT}", limit=3)
    assert handshakes("/ws/echo/", 4) == [True, True, True, False]
    assert handshakes("/ws/echo/", 3, client=OTHER) == [True, True, True]


def test_handshakes_are_keyed_by_header_and_query_parameter() -> None:
    rule("keys", "/ws/", 1, key_kind="header", key_arg="X-Api-Key", algorithm="fixed_window")
    rule("rooms", "/ws/", 2, key_kind="param", key_arg="room", algorithm="fixed_window")
    a = [(b"x-api-key", b"a")]
    b = [(b"x-api-key", b"b")]
    assert handshakes("/ws/echo/?room=1", 2, headers=a) == [True, False]
    assert handshakes("/ws/echo/?room=1", 1, headers=b) == [True]
    assert handshakes("/ws/echo/?room=1", 1, headers=[(b"x-api-key", b"c")]) == [False]
    assert handshakes("/ws/echo/?room=2", 1, headers=[(b"x-api-key", b"d")]) == [True]


def test_trusted_proxies_key_by_the_forwarded_address(settings: Any) -> None:
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "TRUSTED_PROXIES": 1}
    rule("sockets", "/ws/", 1, algorithm="fixed_window")
    forwarded = [(b"x-forwarded-for", OTHER.encode())]
    assert handshakes("/ws/echo/", 2, headers=forwarded) == [True, False]
    assert handshakes("/ws/echo/", 1, client="192.0.2.1", headers=forwarded) == [False]
    assert handshakes("/ws/echo/", 1) == [True]  # no header: the proxy's own address


def test_a_custom_key_function_gets_the_connection() -> None:
    rule("tenants", "/ws/", 1, key_kind="custom", key_arg="tenant", algorithm="fixed_window")
    tenant = [(b"x-tenant", b"acme")]
    assert handshakes("/ws/echo/", 2, headers=tenant) == [True, False]
    assert handshakes("/ws/echo/", 1, headers=[(b"x-tenant", b"other")]) == [True]


def test_a_user_rule_counts_the_logged_in_user_of_the_session(
    django_user_model: Any, client: Any
) -> None:
    rule("users", "/ws/", 1, key_kind="user", algorithm="fixed_window")
    user = django_user_model.objects.create_user("ada", password="pw")
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    assert handshakes("/ws/echo/", 2, headers=[(b"cookie", cookie)]) == [True, False]
    assert handshakes("/ws/echo/", 2) == [True, True]  # anonymous: a user rule counts nobody


def test_a_refused_handshake_is_logged_signalled_and_measured() -> None:
    rule("sockets", "/ws/", 1, algorithm="fixed_window")
    seen: list[Any] = []

    def receiver(sender: Any, request: Any, rule: str, **kwargs: Any) -> None:
        seen.append((request.method, request.path, rule))

    request_throttled.connect(receiver)
    try:
        assert handshakes("/ws/echo/", 2) == [True, False]
    finally:
        request_throttled.disconnect(receiver)
    assert seen == [("WEBSOCKET", "/ws/echo/", "sockets")]
    flush()
    assert sum(r.count for r in Rejection.objects.filter(rule="sockets")) == 1


def test_a_fail_closed_rule_refuses_handshakes_while_the_store_hangs(
    settings: Any, redis_server: RedisServer
) -> None:
    if not redis_server.managed:
        pytest.skip("needs a redis-server the harness runs; unset REDIS_URL")
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "TIMEOUT": 0.2}
    rule("sockets", "/ws/", 100, fail_mode="closed")
    rule("open", "/ws/sync/", 100)
    assert handshakes("/ws/echo/", 1) == [True]
    redis_server.pause()
    try:
        start, body = run(lambda: denied("/ws/echo/", DENIAL))
        assert handshakes("/ws/sync/", 1) == [False]  # the closed rule applies there too
    finally:
        redis_server.resume()
    assert start["status"] == 503
    headers = dict(start["headers"])
    assert b"retry-after" in headers and b"x-ratelimit-limit" not in headers
    assert connected == ["/ws/echo/"]


def test_other_scopes_pass_through_untouched() -> None:
    rule("everything", "*", 1, algorithm="fixed_window")
    seen: list[Any] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope)

    async def body() -> None:
        for _ in range(3):
            await ThrottleMiddleware(inner)({"type": "http", "path": "/"}, None, None)

    run(body)
    assert seen == [{"type": "http", "path": "/"}] * 3


# Messages


async def conversation(path: str, messages: list[str], client: str = CLIENT) -> list[Any]:
    """What the consumer answers to each message, then how it closed (if it did)."""
    talk = communicator(path, client=client)
    accepted, _ = await talk.connect()
    assert accepted
    answers: list[Any] = []
    for text in messages:
        await talk.send_to(text_data=text)
        answer = await talk.receive_output(2)
        if answer["type"] == "websocket.close":
            answers.append(("closed", answer.get("code")))
            break
        answers.append(answer["text"])
    await talk.disconnect()
    return answers


def throttled(answer: Any) -> int | None:
    if isinstance(answer, str) and answer.startswith("{"):
        frame = json.loads(answer)
        if frame.get("error") == "throttled":
            return int(frame["retry_after"])
    return None


@pytest.mark.parametrize("path", ["/ws/sync/", "/ws/async/"])
def test_messages_over_the_limit_never_reach_receive(path: str) -> None:
    rule("chat", "chat", 2, algorithm="fixed_window")
    answers = run(lambda: conversation(path, ["a", "b", "c"]))
    assert answers[:2] == ["echo:a", "echo:b"]
    assert 1 <= (throttled(answers[2]) or 0) <= 60
    # Another connection of the same client shares the counter; another client does not.
    assert throttled(run(lambda: conversation(path, ["d"]))[0])
    assert run(lambda: conversation(path, ["e"], client=OTHER)) == ["echo:e"]


@pytest.mark.parametrize("path", ["/ws/sync/", "/ws/async/"])
def test_the_socket_closes_with_4429_after_rejections_in_a_row(path: str) -> None:
    rule("chat", "chat", 1, algorithm="fixed_window")
    answers = run(lambda: conversation(path, ["a", "b", "c", "d", "e"]))
    assert answers[0] == "echo:a"
    assert [throttled(a) is not None for a in answers[1:4]] == [True, True, True]
    assert answers[4] == ("closed", 4429)  # throttle_close_after = 3


def test_a_json_consumer_is_throttled_before_receive_json() -> None:
    rule("chat", "chat", 1, algorithm="fixed_window")
    answers = run(lambda: conversation("/ws/json/", ['{"a": 1}', '{"a": 2}']))
    assert json.loads(answers[0]) == {"echo": {"a": 1}}
    assert throttled(answers[1])


def test_throttle_cost_weighs_messages() -> None:
    rule("chat", "chat", 3, algorithm="fixed_window")
    answers = run(lambda: conversation("/ws/async/", ["ping", "heavy", "ping", "a", "b"]))
    assert answers[:4] == ["echo:ping", "echo:heavy", "echo:ping", "echo:a"]
    assert throttled(answers[4])


def test_throttled_can_answer_its_own_way() -> None:
    rule("chat", "chat", 1, algorithm="fixed_window")
    assert run(lambda: conversation("/ws/quiet/", ["a", "b"])) == ["echo:a", "slow down: chat"]


def test_message_rules_see_overrides_and_exemptions() -> None:
    chat = rule("chat", "chat", 1, algorithm="fixed_window", exempt_networks=OTHER)
    Override.objects.create(rule=chat, key=f"ip:{CLIENT}", limit=2)
    assert run(lambda: conversation("/ws/async/", ["a", "b", "c"]))[:2] == ["echo:a", "echo:b"]
    assert run(lambda: conversation("/ws/async/", ["a", "b", "c"], client=OTHER)) == [
        "echo:a",
        "echo:b",
        "echo:c",
    ]


def test_a_consumer_without_the_middleware_keys_by_its_own_scope() -> None:
    rule("chat", "chat", 1, algorithm="fixed_window")
    bare = URLRouter([path("ws/async/", AsyncChat.as_asgi())])

    async def body() -> list[Any]:
        talk = communicator("/ws/async/", app=bare)
        await talk.connect()
        answers = []
        for text in ("a", "b"):
            await talk.send_to(text_data=text)
            answers.append((await talk.receive_output(2))["text"])
        await talk.disconnect()
        return answers

    answers = run(body)
    assert answers[0] == "echo:a" and throttled(answers[1])


# The documented example: asgi.py and chat/routing.py of docs/usage.md, a project of its own

CHAT_SITE = Path(__file__).parent / "recipes" / "chat_site"


def test_the_docs_asgi_and_chat_routing_are_the_files_the_tests_run() -> None:
    usage = (Path(__file__).parent.parent / "docs" / "usage.md").read_text()
    for name in ("asgi.py", "chat/routing.py"):
        blocks = re.findall(rf"```python\n(# {re.escape(name)}\b.*?)```", usage, re.S)
        assert blocks == [(CHAT_SITE / name).read_text()], name


@pytest.fixture
def chat_asgi(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The documented asgi.py's application, imported as a server imports it."""
    monkeypatch.syspath_prepend(str(CHAT_SITE))
    for name in ("asgi", "chat", "chat.routing"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import asgi  # type: ignore[import-not-found]

    return asgi.application


def test_the_docs_chat_example_limits_handshakes_and_messages(chat_asgi: Any) -> None:
    rule("chat-connect", "/ws/chat/", 2, methods="WEBSOCKET", algorithm="fixed_window")
    rule("chat-messages", "chat", 3, key_kind="user_or_ip", algorithm="fixed_window")

    async def body() -> tuple[list[Any], Any, list[bool]]:
        talk = communicator("/ws/chat/lobby/", app=chat_asgi)
        assert (await talk.connect())[0]
        answers = []
        for text in ["hi", "x" * 1500, "a", "b", "c", "d", "e"]:
            await talk.send_json_to({"text": text})
            answers.append(await talk.receive_json_from(2))
        closed = await talk.receive_output(2)
        await talk.disconnect()
        second = await handshake("/ws/chat/lobby/", app=chat_asgi)
        third = await handshake("/ws/chat/other/", app=chat_asgi)
        return answers, closed, [second, third]

    answers, closed, later = run(body)
    assert answers[:2] == [{"echo": "hi"}, {"echo": "x" * 1500}]  # 1 + 2 of the 3 messages
    assert all(a["error"] == "throttled" and a["retry_after"] >= 1 for a in answers[2:])
    assert closed == {"type": "websocket.close", "code": 4429}  # the fifth rejection in a row
    assert later == [True, False]  # two handshakes a minute: the test's, then this one


@pytest.mark.slow
@pytest.mark.parametrize(
    ("server", "refused"),
    [
        (["daphne", "-b", "127.0.0.1", "-p", "{port}", "asgi:application"], "HTTP/1.1 403"),
        (["uvicorn", "--ws", "wsproto", "--port", "{port}", "asgi:application"], "HTTP/1.1 429"),
    ],
    ids=["daphne", "uvicorn"],
)
def test_the_docs_asgi_file_is_served_as_it_is(
    settings: Any, server: list[str], refused: str
) -> None:
    """The whole file under each server, which finds the settings by the file's own line."""
    rule("chat-connect", "/ws/chat/", 1, methods="WEBSOCKET", algorithm="fixed_window")
    environ = {"DJANGO_SETTINGS_MODULE": None, "PYTHONPATH": str(CHAT_SITE)}
    with serving(server, settings.DATABASES["default"], environ=environ) as port:
        assert raw_handshake(port, "/ws/chat/lobby/").startswith("HTTP/1.1 101")
        assert raw_handshake(port, "/ws/chat/lobby/").startswith(refused)


# A real server


def raw_handshake(port: int, path: str) -> str:
    """The status line and headers a server answers to a WebSocket upgrade request."""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request.encode())
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
    return received.decode("latin1")


@pytest.mark.slow
def test_daphne_answers_a_refused_handshake_with_403(settings: Any) -> None:
    rule("sockets", "/ws/", 1, algorithm="fixed_window")
    database = settings.DATABASES["default"]
    server = ["daphne", "-b", "127.0.0.1", "-p", "{port}", "tests.channels_served:application"]
    with serving(server, database) as port:
        assert raw_handshake(port, "/ws/echo/").startswith("HTTP/1.1 101")
        assert raw_handshake(port, "/ws/echo/").startswith("HTTP/1.1 403")


@pytest.mark.slow
def test_uvicorn_answers_a_refused_handshake_with_429(settings: Any) -> None:
    import wsproto as ws  # in the test extra: uvicorn's WebSockets need it

    assert ws
    rule("sockets", "/ws/", 1, algorithm="fixed_window")
    database = settings.DATABASES["default"]
    server = [
        "uvicorn",
        "--ws",
        "wsproto",
        "--port",
        "{port}",
        "tests.channels_served:application",
    ]
    with serving(server, database) as port:
        assert raw_handshake(port, "/ws/echo/").startswith("HTTP/1.1 101")
        refused = raw_handshake(port, "/ws/echo/")
    assert refused.startswith("HTTP/1.1 429")
    assert re.search(r"(?im)^retry-after: \d+\r$", refused)
    assert re.search(r'(?im)^ratelimit-policy: "sockets";q=1;w=60\r$', refused)


@pytest.mark.slow
def test_the_demo_serves_its_echo_under_the_demo_rules(tmp_path: Path) -> None:
    """`manage.py demo` (what scripts/demo runs) serves WebSockets with Daphne's runserver;
    the demo's echo-connect rule allows ten handshakes a minute per address."""
    with demo_server(tmp_path) as (port, _):
        answers = [raw_handshake(port, "/ws/echo/") for _ in range(11)]
    assert [a.split(" ")[1] for a in answers] == ["101"] * 10 + ["403"]


def test_a_bad_throttle_cost_is_a_clear_error() -> None:
    rule("chat", "chat", 5, algorithm="fixed_window")

    class Bad(AsyncChat):
        def throttle_cost(self, text_data: Any = None, bytes_data: Any = None) -> int:
            return -1

    async def body() -> None:
        talk = communicator("/ws/", app=Bad.as_asgi())
        await talk.connect()
        await talk.send_to(text_data="a")
        await talk.wait(2)

    with pytest.raises(ValueError, match=r"Bad\.throttle_cost\(\) must return a whole number"):
        run(body)


def test_a_concurrency_rule_limits_the_connections_open_at_once() -> None:
    rule("open-sockets", "/ws/", 1, algorithm="concurrency")

    async def body() -> list[bool]:
        first = communicator("/ws/echo/")
        assert (await first.connect())[0]
        while_open = await handshake("/ws/echo/")
        await first.disconnect()
        await first.wait(2)  # the middleware's call is over: the slot is given back
        return [while_open, await handshake("/ws/echo/")]

    assert run(body) == [False, True]


def test_handshakes_and_messages_are_decided_on_the_loop_once_the_rules_are_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AuthMiddlewareStack has loaded the user: a user rule needs no thread hop either."""
    import threading

    rule("sockets", "/ws/", 100, key_kind="user_or_ip", algorithm="fixed_window")
    rule("chat", "chat", 100, key_kind="user_or_ip", algorithm="fixed_window")
    places, loop = where_gathered(monkeypatch)

    async def body() -> list[Any]:
        loop.append(threading.get_ident())
        first = await conversation("/ws/async/", ["a"])  # loads the rules: in a thread
        return [first, await conversation("/ws/async/", ["b", "c"])]

    assert run(body) == [["echo:a"], ["echo:b", "echo:c"]]
    assert places[0] == "thread" and set(places[1:]) == {"loop"}


def test_message_rules_count_the_user_of_the_handshake(django_user_model: Any, client: Any) -> None:
    rule("chat", "chat", 1, key_kind="user", algorithm="fixed_window")
    client.force_login(django_user_model.objects.create_user("ada", password="pw"))
    cookie = [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]

    async def talk(client_ip: str, headers: Any) -> list[Any]:
        socket = communicator("/ws/sync/", client=client_ip, headers=headers)
        assert (await socket.connect())[0]
        await socket.send_to(text_data="a")
        answer = await socket.receive_from(2)
        await socket.disconnect()
        return [answer]

    async def body() -> list[Any]:
        return [
            *await talk(CLIENT, cookie),
            *await talk(OTHER, cookie),  # the same user from another address: one counter
            *await talk(OTHER, None),  # anonymous: a user rule does not count it
        ]

    first, second, anonymous = run(body)
    assert first == "echo:a" and throttled(second) and anonymous == "echo:a"
