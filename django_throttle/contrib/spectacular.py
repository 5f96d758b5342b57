"""drf-spectacular: ``document_limits``, a postprocessing hook describing in the schema the
limits of every operation a rule, a ``@throttle`` or the DRF ``RuleThrottle`` covers.

drf-spectacular calls the hook (settings name it); this module imports neither it nor DRF.
"""

from __future__ import annotations

from typing import Any

from django.urls import Resolver404, resolve

from ..views import view_scopes
from .openapi import concrete_path, document_schema


def document_limits(result: dict[str, Any], generator: Any, request: Any, public: Any) -> Any:
    """``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``: each covered operation gets a 429
    (problem+json) with Retry-After, RateLimit and RateLimit-Policy, those headers on its 2xx
    and 4xx responses, and ``x-ratelimit``; an operation no rule covers gets none."""
    return document_schema(result, _throttle_scopes)


def _throttle_scopes(path: str, method: str, operation: dict[str, Any]) -> list[str]:
    """The scopes the operation's view's throttle classes decide (a DRF RuleThrottle's
    ``throttle_scope``)."""
    try:
        view = resolve(concrete_path(path)).func
    except Resolver404:
        return []
    return view_scopes(view)
