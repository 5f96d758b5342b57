"""The limits covering an API operation, written into its OpenAPI description: a 429 with the
problem+json schema, the rate-limit headers and ``x-ratelimit``. Shared by the django-ninja and
drf-spectacular integrations; it imports neither."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.urls import Resolver404, resolve

from ..compiled import CompiledRule
from ..engine import SPECS_ATTR
from ..responses import POLICY as RATELIMIT_POLICY
from ..responses import PROBLEM, RATELIMIT, RETRY_AFTER
from ..rules import get_rules, scope_rules

# An OpenAPI path template's parameter ("{pk}"): matched by a path rule as one segment "1".
_PARAMETER = re.compile(r"\{[^}/]*\}")
OPERATIONS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
EXTENSION = "x-ratelimit"


def problem_schema() -> dict[str, Any]:
    """A new copy each time: a schema it is written into may be changed after."""
    return {
        "type": "object",
        "description": "An RFC 9457 problem: the request exceeded a rate limit.",
        "properties": {
            "type": {"type": "string", "format": "uri-reference"},
            "title": {"type": "string"},
            "status": {"type": "integer", "enum": [429]},
            "detail": {"type": "string"},
            "violated-policies": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The names of the rules that rejected the request.",
            },
            "retry_after": {"type": "integer", "minimum": 1},
        },
        "required": ["type", "title", "status"],
    }


def json_schema() -> dict[str, Any]:
    """A new copy each time: a schema it is written into may be changed after."""
    return {
        "type": "object",
        "properties": {
            "detail": {"type": "string"},
            "retry_after": {"type": "integer", "minimum": 1},
        },
        "required": ["detail", "retry_after"],
    }


def rate_headers() -> dict[str, Any]:
    """A new copy each time: a schema it is written into may be changed after."""
    return {
        RATELIMIT: {
            "description": "The most constrained rule's remaining quota and the seconds until "
            'it resets: "name";r=remaining;t=seconds (IETF RateLimit header fields).',
            "schema": {"type": "string"},
        },
        RATELIMIT_POLICY: {
            "description": 'That rule\'s quota and window in seconds: "name";q=limit;w=period.',
            "schema": {"type": "string"},
        },
    }


def retry_header() -> dict[str, Any]:
    """A new copy each time: a schema it is written into may be changed after."""
    return {
        RETRY_AFTER: {
            "description": "Seconds to wait before retrying.",
            "schema": {"type": "integer", "minimum": 1},
        }
    }


def covering(path: str, method: str, scopes: Iterable[str] = ()) -> list[CompiledRule]:
    """The enforcing rules a request to ``path`` (a URL path or an OpenAPI path template) with
    ``method`` meets: its path rules, its URL name's, its view's ``@throttle`` scopes and
    ``scopes`` (a throttle class's), each once."""
    ruleset = get_rules()
    method = method.upper()
    concrete = concrete_path(path)
    chosen: dict[str, CompiledRule] = {}
    for rule in ruleset.for_path(concrete, method):
        chosen[rule.state_prefix] = rule
    names = list(scopes)
    try:
        match = resolve(concrete)
    except Resolver404:
        pass
    else:
        for rule in ruleset.for_scope(match.view_name, method):
            chosen.setdefault(rule.state_prefix, rule)
        names += [spec.scope for spec in view_specs(match.func)]
    for scope in names:
        for rule in scope_rules(ruleset, scope, method):
            chosen.setdefault(rule.state_prefix, rule)
    return [rule for rule in chosen.values() if rule.enforcing]


def concrete_path(path: str) -> str:
    """An OpenAPI path template as a request's path: each parameter is "1"."""
    return _PARAMETER.sub("1", path)


def view_specs(view: Any) -> list[Any]:
    """A view's @throttle scopes: on the function, or on a class-based view's dispatch."""
    specs = getattr(view, SPECS_ATTR, None)
    if specs is None:
        view_class = getattr(view, "view_class", None) or getattr(view, "cls", None)
        specs = getattr(getattr(view_class, "dispatch", None), SPECS_ATTR, None)
    return list(specs or [])


def document(operation: dict[str, Any], rules: Iterable[CompiledRule]) -> None:
    """Describe ``rules`` on an OpenAPI operation object: the rate-limit headers on its 2xx and
    4xx responses, a 429 with the problem+json schema and Retry-After, and ``x-ratelimit``.
    Nothing without rules."""
    limits = [{"name": r.name, "limit": r.limit, "period": r.period} for r in rules]
    if not limits:
        return
    responses = operation.setdefault("responses", {})
    # ninja keys responses by int, drf-spectacular by str: one kind, or sorting keys fails.
    code: int | str = 429 if any(isinstance(k, int) for k in responses) else "429"
    responses[code] = {
        "description": "Too many requests: a rate limit of this operation was exceeded.",
        "headers": {**retry_header(), **rate_headers()},
        "content": {
            PROBLEM: {"schema": problem_schema()},
            "application/json": {"schema": json_schema()},
        },
    }
    for status, response in responses.items():
        if str(status)[:1] in ("2", "4") and isinstance(response, dict):
            headers = response.setdefault("headers", {})
            for name, header in rate_headers().items():
                headers.setdefault(name, header)
    operation[EXTENSION] = limits


def operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(path, method, operation object) of each operation of an OpenAPI document."""
    for path, item in (schema.get("paths") or {}).items():
        for method in OPERATIONS:
            operation = item.get(method) if isinstance(item, dict) else None
            if isinstance(operation, dict):
                yield path, method, operation


def document_schema(
    schema: dict[str, Any], scopes_of: Callable[[str, str, dict[str, Any]], Iterable[str]]
) -> dict[str, Any]:
    """Describe on every operation of ``schema`` the rules covering it; ``scopes_of(path,
    method, operation)``: the scopes of the operation's own throttle."""
    for path, method, operation in operations(schema):
        document(operation, covering(path, method, scopes_of(path, method, operation)))
    return schema
