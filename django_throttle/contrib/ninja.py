"""django-ninja: ``RuleThrottle``, a ninja throttle deciding a request under a scope's rules (or
the rules ThrottleMiddleware would apply), and ``document_limits(api)`` for the API's schema.

django-ninja stays optional: this module imports it, nothing else in django_throttle does.
"""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

try:
    from ninja import NinjaAPI
    from ninja.errors import Throttled
    from ninja.throttling import BaseThrottle
except ImportError as error:  # pragma: no cover - tested in a subprocess without django-ninja
    raise ImportError(
        "django_throttle.contrib.ninja needs django-ninja 1.6 or newer: install the "
        '"ninja" extra (django-throttle-rules[ninja])'
    ) from error

from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse

from ..conf import conf
from ..decision import Decision
from ..engine import evaluate, under_middleware
from ..responses import add_headers, rejected
from ..rules import ScopeSpec
from ..runtime import runtime
from .openapi import document_schema, view_specs

DECISION_ATTR = "_django_throttle_ninja"  # the request's decision, for the API's response
_ANSWERS_ATTR = "_django_throttle_answers"  # on an API whose Throttled handler is ours


class RuleThrottle(BaseThrottle):
    """Decides a request under the rules of ``scope`` (admin rules, else code defaults) or,
    with None, the rules ThrottleMiddleware would apply (its path, its URL name), through the
    engine: one store call for all of them, none for a rule that has counted it already."""

    def __init__(self, scope: str | None = None) -> None:
        self.scope = scope
        # The scope it decides, for the status endpoint, which does not import ninja; None for
        # the middleware's rules, which the endpoint finds by themselves.
        self.rule_scope = scope
        self.specs = [ScopeSpec(scope, None, 1)] if scope else []
        # One throttle serves every request: the decision wait() reports is the caller's own.
        self._decision: ContextVar[Decision | None] = ContextVar(
            f"django_throttle_ninja_{id(self)}", default=None
        )

    def allow_request(self, request: HttpRequest) -> bool:
        # ninja calls throttles from Operation._check_throttles and answers a refusal with
        # the exception handler of its API for Throttled: the caller's frame is how a
        # throttle reaches that API, to answer as everywhere else (headers, problem+json).
        _answer_for(getattr(sys._getframe(1).f_locals.get("self"), "api", None))
        decision = self._decide(request)
        self._decision.set(decision)
        if not decision.allowed or getattr(request, DECISION_ATTR, None) is None:
            setattr(request, DECISION_ATTR, decision)
        return decision.allowed

    def wait(self) -> float | None:
        decision = self._decision.get()
        if decision is None or decision.allowed:
            return None
        return max(1.0, decision.retry_after)

    def _decide(self, request: HttpRequest) -> Decision:
        if self.scope is None:
            match = getattr(request, "resolver_match", None)
            url_name = match.view_name if match is not None else None
            args: tuple[Any, ...] = (request, self.specs, True, url_name)
        else:
            args = (request, self.specs, False, None)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return _evaluate(*args)
        # An async operation: ninja calls throttles without awaiting them. Refreshing the
        # rules or reading a user's groups may query the database, which Django forbids on
        # the loop: the decision is made in a thread while the loop waits for it.
        return runtime().part(Deciders).pool.submit(_in_thread, *args).result()


def _evaluate(request: Any, specs: list[ScopeSpec], paths: bool, url_name: str | None) -> Decision:
    return evaluate(request, specs, paths=paths, url_name=url_name)


def _in_thread(request: Any, specs: list[ScopeSpec], paths: bool, url_name: str | None) -> Decision:
    try:
        return _evaluate(request, specs, paths, url_name)
    finally:
        # No request ends in this thread, so nothing else would close what it opened (as
        # Django does at a request's end: by CONN_MAX_AGE).
        close_old_connections()


class Deciders:
    """The threads deciding for async operations (a runtime part: closed with it)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="django_throttle_ninja")

    def close(self) -> None:
        self.pool.shutdown(wait=False)


def _answer_for(api: NinjaAPI | None) -> None:
    """Make the API answer a RuleThrottle's refusal as ThrottleMiddleware does (another
    throttle's as before), and write the rate-limit headers of an admitted request where
    ThrottleMiddleware is not there to."""
    if api is None or getattr(api, _ANSWERS_ATTR, False):
        return
    before = api._lookup_exception_handler(Throttled(wait=None))
    temporal = api.create_temporal_response

    def throttled(request: HttpRequest, exc: Any) -> HttpResponse:
        decision = getattr(request, DECISION_ATTR, None)
        if decision is None or decision.allowed:
            if before is None:
                raise exc
            return before(request, exc)
        return rejected(request, decision)

    def create_temporal_response(request: HttpRequest) -> HttpResponse:
        response = temporal(request)
        decision = getattr(request, DECISION_ATTR, None)
        if decision is not None and conf.HEADERS and not under_middleware(request):
            add_headers(response, decision)
        return response

    api.add_exception_handler(Throttled, throttled)
    api.create_temporal_response = create_temporal_response  # type: ignore[method-assign]
    setattr(api, _ANSWERS_ATTR, True)


def document_limits(api: NinjaAPI) -> NinjaAPI:
    """Describe in the API's OpenAPI schema, on each operation a rule, a @throttle or a
    RuleThrottle covers, its 429 (problem+json), the rate-limit headers and ``x-ratelimit``;
    the rules are read each time the schema is made. Returns the API."""
    generate = api.get_openapi_schema

    def get_openapi_schema(*args: Any, **kwargs: Any) -> Any:
        schema = generate(*args, **kwargs)
        scopes = _throttle_scopes(api)
        return document_schema(
            schema, lambda path, method, op: scopes.get(op.get("operationId"), ())
        )

    api.get_openapi_schema = get_openapi_schema  # type: ignore[method-assign]
    return api


def _throttle_scopes(api: NinjaAPI) -> dict[str | None, list[str]]:
    """The scopes of each operation's RuleThrottles and @throttle, by operation id."""
    found: dict[str | None, list[str]] = {}
    for bound in api._get_bound_routers():
        for view in bound.path_operations.values():
            for operation in view.operations:
                op_id = operation.operation_id or api.get_openapi_operation_id(operation)
                scopes = [
                    t.scope
                    for t in operation.throttle_objects
                    if isinstance(t, RuleThrottle) and t.scope is not None
                ]
                scopes += [spec.scope for spec in view_specs(operation.view_func)]
                found[op_id] = scopes
    return found
