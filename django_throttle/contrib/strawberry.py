"""``ThrottleExtension``: each GraphQL operation is one request under a scope's rules, with a
cost read from its document, so one POST asking for a million fields costs what it asks for.

Strawberry stays optional: this module imports it, nothing else in django_throttle does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from django.http import HttpRequest, HttpResponseBase
from graphql import DocumentNode, ExecutionResult, GraphQLError
from strawberry.extensions import SchemaExtension

from ..api import acheck, check
from ..conf import conf
from ..costs import clamped_cost
from ..decision import Decision
from ..responses import add_headers, rejection_detail, rejection_headers, retry_after_seconds
from .graphql_cost import query_cost

Cost = Callable[[DocumentNode], int]

THROTTLED = "THROTTLED"
UNAVAILABLE = "UNAVAILABLE"


class ThrottleExtension:
    """``strawberry.Schema(Query, extensions=[ThrottleExtension(scope="graphql")])``.

    Each operation counts once under the rules of ``scope``, with the cost ``cost(document)``
    (default :func:`query_cost`), decided after validation and before any resolver runs. A
    rejected operation runs no resolver: its result is a GraphQL error whose extensions are
    ``{"code": "THROTTLED", "retry_after": N}`` (``"UNAVAILABLE"`` when the store is down
    and the rule fails closed), and the HTTP response of strawberry's Django view carries
    ``Retry-After`` and the rate-limit headers.

    Strawberry makes one extension per operation from this factory: the one for async
    execution (``AsyncGraphQLView``) awaits the store, the one for sync execution calls it."""

    def __init__(self, scope: str = "graphql", cost: Cost | None = None) -> None:
        if not isinstance(scope, str) or not scope:
            raise ValueError(f"ThrottleExtension scope must be a non-empty string, not {scope!r}")
        if cost is not None and not callable(cost):
            raise ValueError(f"ThrottleExtension cost must be a callable, not {cost!r}")
        self.scope = scope
        self.cost = cost

    def __call__(self, **_: Any) -> SchemaExtension:
        # (Strawberry before 0.33x calls a factory with execution_context=None.)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return _SyncThrottle(self)
        return _AsyncThrottle(self)


class _Throttle(SchemaExtension):
    def __init__(self, config: ThrottleExtension) -> None:
        super().__init__()
        self.config = config

    def request_and_cost(self) -> tuple[HttpRequest, int]:
        context = self.execution_context.context
        request = getattr(context, "request", None)
        if request is None and isinstance(context, Mapping):
            request = context.get("request")
        if request is None:
            raise TypeError(
                "ThrottleExtension needs the Django request as the context's 'request' "
                "(strawberry.django.views provide it)"
            )
        document = self.execution_context.graphql_document
        if document is None:
            return request, 1
        if self.config.cost is not None:
            return request, clamped_cost(self.config.cost(document))
        variables = self.execution_context.variables
        return request, query_cost(document, self.execution_context.operation_name, variables)

    def answer(self, decision: Decision) -> None:
        """The decision's headers on the HTTP response; a rejection's GraphQL error as the
        operation's result, which keeps strawberry from executing it."""
        response = getattr(self.execution_context.context, "response", None)
        if isinstance(response, HttpResponseBase) and decision.rule is not None:
            if not decision.allowed:
                rejection_headers(response, decision)
            elif conf.HEADERS:
                add_headers(response, decision)
        if decision.allowed:
            return
        code = UNAVAILABLE if decision.unavailable else THROTTLED
        error = GraphQLError(
            rejection_detail(decision),
            extensions={"code": code, "retry_after": retry_after_seconds(decision)},
        )
        self.execution_context.result = ExecutionResult(data=None, errors=[error])


class _SyncThrottle(_Throttle):
    def on_execute(self) -> Iterator[None]:
        request, cost = self.request_and_cost()
        self.answer(check(request, self.config.scope, cost))
        yield


class _AsyncThrottle(_Throttle):
    async def on_execute(self) -> AsyncIterator[None]:
        request, cost = self.request_and_cost()
        self.answer(await acheck(request, self.config.scope, cost))
        yield
