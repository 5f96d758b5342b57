"""``status``: the caller's rules for a path and method, and what is left of each, spending
nothing."""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import unquote

from django.http import HttpRequest, JsonResponse, QueryDict
from django.urls import Resolver404, get_script_prefix, resolve
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_safe

from .compiled import CompiledRule
from .engine import preview
from .responses import RETRY_AFTER, policy_field, retry_after_seconds
from .store import Result

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
MAX_PATH_CHARS = 2048
# What a key function, a user rule or an audience may read of the caller's request.
_CARRIED = ("user", "auser", "session", "auth")


@require_safe
def status(request: HttpRequest) -> JsonResponse:
    """``{"rules": [...]}``: each rule a request by the caller to ``?path=`` (default ``/``)
    with ``?method=`` (default ``GET``) would meet, with its limit, what remains, when it
    resets and its RateLimit-Policy item; one store call, nothing consumed."""
    try:
        path, query, method = _target(request.GET)
    except ValueError as error:
        return _answer({"error": str(error)}, 400)
    probe = _probe(request, path, query, method)
    view = _view_of(probe, request)
    rules, decision = preview(probe, view, view_scopes(view, method))
    if decision.unavailable:  # a fail-closed rule, the store down: the request would get a 503
        seconds = retry_after_seconds(decision)
        response = _answer(
            {"error": "The rate-limit store is unavailable.", "retry_after": seconds}, 503
        )
        response[RETRY_AFTER] = str(seconds)
        return response
    results = {result.rule.state_prefix: result for result in decision.results}
    entries = [_entry(rule, results.get(rule.state_prefix)) for rule in rules if rule.enforcing]
    return _answer({"rules": entries}, 200)


def _target(params: QueryDict) -> tuple[str, str, str]:
    """The path (decoded, as Django's path_info is), its query string and the method asked
    about; ValueError with what is wrong."""
    raw = params.get("path", "/")
    if not raw.startswith("/") or len(raw) > MAX_PATH_CHARS:
        raise ValueError(
            f"path must be a URL path starting with '/', at most {MAX_PATH_CHARS} characters"
        )
    where, _, query = raw.partition("?")
    try:
        path = unquote(where, errors="strict")
    except UnicodeDecodeError:
        raise ValueError("path must be UTF-8 once percent-decoded") from None
    if any(c < " " or c == "\x7f" for c in path):
        raise ValueError("path must not contain control characters")
    method = params.get("method", "GET")
    if method.upper() not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}")
    return path, query, method.upper()


def _probe(request: HttpRequest, path: str, query: str, method: str) -> HttpRequest:
    """A request by the same client (its address, headers, user) to ``path``: what identity,
    audience and selection read is the caller's own."""
    probe = HttpRequest()
    prefix = get_script_prefix()
    path_info = path
    if prefix != "/" and path.startswith(prefix):
        path_info = "/" + path[len(prefix) :]
    probe.path, probe.path_info, probe.method = path, path_info, method
    probe.META = {
        **request.META,
        "REQUEST_METHOD": method,
        "PATH_INFO": path_info,
        "QUERY_STRING": query,
    }
    probe.GET = QueryDict(query)
    probe.COOKIES = request.COOKIES
    for name in _CARRIED:
        if hasattr(request, name):
            setattr(probe, name, getattr(request, name))
    return probe


def _view_of(probe: HttpRequest, request: HttpRequest) -> Any:
    """The view ``probe`` would reach (its @throttle scopes and URL name), or None."""
    try:
        match = resolve(probe.path_info, getattr(request, "urlconf", None))
    except Resolver404:
        return None  # unrouted: the path rules only, as the middleware decides a 404
    probe.resolver_match = match
    return match.func


def view_scopes(view: Any, method: str = "GET") -> list[str]:
    """The scopes decided inside a view by throttles that tell them: a DRF class-based view's
    throttle classes (``view_scopes``, as contrib.drf.RuleThrottle tells them) and the
    throttles of the django-ninja operation ``method`` reaches (``rule_scope``, as
    contrib.ninja.RuleThrottle tells it: its API's, its router's or its own)."""
    view_class = getattr(view, "cls", None) or getattr(view, "view_class", None)
    scopes: list[str] = []
    for throttle in getattr(view_class, "throttle_classes", None) or ():
        told = getattr(throttle, "view_scopes", None)
        if callable(told):
            scopes += told(view_class)
    # A ninja path's view is a wrapper around its PathView, which holds the operations.
    for cell in getattr(view, "__closure__", None) or ():
        for operation in getattr(cell.cell_contents, "operations", None) or ():
            if method in getattr(operation, "methods", ()):
                for throttle in getattr(operation, "throttle_objects", None) or ():
                    scope = getattr(throttle, "rule_scope", None)
                    if isinstance(scope, str) and scope:
                        scopes.append(scope)
    return scopes


def _entry(rule: CompiledRule, result: Result | None) -> dict[str, Any]:
    if result is None:
        # The store is down, the rule fails open and LOCAL_FALLBACK is off: nothing known.
        limit, remaining, reset = rule.limit, None, None
    else:
        limit, remaining, reset = result.limit, max(0, result.remaining), result.reset_at
    return {
        "name": rule.name,
        "limit": limit,
        "remaining": remaining,
        "reset": None if reset is None else math.ceil(reset),
        "policy": policy_field(rule.name, limit, rule.period),
    }


def _answer(body: dict[str, Any], status: int) -> JsonResponse:
    response = JsonResponse(body, status=status)
    add_never_cache_headers(response)  # one client's budget, changing with every request
    return response
