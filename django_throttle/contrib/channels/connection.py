"""A WebSocket connection as the request-like object the engine keys: META, GET, path, user."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any

from django.http import QueryDict
from django.http.request import HttpHeaders
from django.utils.functional import empty

METHOD = "WEBSOCKET"  # what a rule's ``methods`` names to count handshakes
SCOPE_KEY = "django_throttle.connection"  # where the middleware leaves it for the consumer


class Connection:
    """What keys.py, audience.py and key functions read of an HttpRequest, from the ASGI
    scope of a handshake: ``META`` (REMOTE_ADDR, HTTP_* headers as Django's ASGIRequest
    builds them), ``GET`` (the query string), ``path``/``path_info``, ``method``
    ("WEBSOCKET"), ``user`` (``scope["user"]`` once AuthMiddlewareStack resolved it) and
    ``headers``, ``COOKIES`` and ``scope`` itself."""

    method = METHOD

    def __init__(self, scope: Mapping[str, Any]) -> None:
        self.scope = scope
        self.path: str = scope.get("path") or "/"
        root = scope.get("root_path") or ""
        self.path_info: str = self.path.removeprefix(root) if root else self.path
        query = scope.get("query_string") or b""
        self.query_string: str = query.decode("latin1") if isinstance(query, bytes) else query
        self.META: dict[str, Any] = _meta(scope, root, self.path_info, self.query_string)
        user = scope.get("user")
        self.user: Any = user
        if user is not None and _resolved(user):
            # As AuthenticationMiddleware's cache: the engine decides on the event loop,
            # without a thread hop, for rules keyed by the user.
            self._cached_user = user

    @cached_property
    def GET(self) -> QueryDict:  # noqa: N802 - HttpRequest's name
        return QueryDict(self.query_string)

    @cached_property
    def headers(self) -> HttpHeaders:
        return HttpHeaders(self.META)

    @property
    def COOKIES(self) -> dict[str, str]:  # noqa: N802 - HttpRequest's name
        cookies: dict[str, str] = self.scope.get("cookies") or {}  # CookieMiddleware's
        return cookies

    def for_message(self) -> Connection:
        """The same client, with no decision of its own yet: what one message is decided as
        (a request is counted at most once per rule; each message is a new event)."""
        message = Connection.__new__(Connection)
        message.__dict__.update(
            {name: self.__dict__[name] for name in _SHARED if name in self.__dict__}
        )
        return message


# What a message's Connection shares with its handshake's (not the engine's state of it).
_SHARED = (
    "scope",
    "path",
    "path_info",
    "query_string",
    "META",
    "user",
    "_cached_user",
    "GET",
    "headers",
)


def _resolved(user: Any) -> bool:
    """Whether ``scope["user"]`` is loaded (channels' UserLazyObject, once AuthMiddleware ran)."""
    return getattr(user, "_wrapped", user) is not empty


def _meta(scope: Mapping[str, Any], root: str, path_info: str, query: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "REQUEST_METHOD": METHOD,
        "QUERY_STRING": query,
        "SCRIPT_NAME": root,
        "PATH_INFO": path_info,
    }
    client = scope.get("client")
    if client:
        meta["REMOTE_ADDR"] = client[0]
        meta["REMOTE_HOST"] = client[0]
        meta["REMOTE_PORT"] = client[1]
    server = scope.get("server")
    meta["SERVER_NAME"] = server[0] if server else "unknown"
    meta["SERVER_PORT"] = str(server[1]) if server and len(server) > 1 else "0"
    headers: dict[str, list[str]] = {}
    for raw_name, raw_value in scope.get("headers") or ():
        name = raw_name.decode("latin1").lower()
        if "_" in name:
            continue  # as Django: no spoofing through the ambiguity of "_" and "-"
        headers.setdefault("HTTP_" + name.upper().replace("-", "_"), []).append(
            raw_value.decode("latin1")
        )
    meta.update((name, ",".join(values)) for name, values in headers.items())
    return meta
