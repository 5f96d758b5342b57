"""``RuleThrottle``: a DRF throttle class applying the rules of a view's ``throttle_scope``.

DRF stays optional: this module imports it, nothing else in django_throttle does.
"""

from __future__ import annotations

from typing import Any

from rest_framework.throttling import BaseThrottle

from ..api import check
from ..decision import Decision


class RuleThrottle(BaseThrottle):  # type: ignore[misc]
    """Decides through the same engine (one store call); ``wait()`` gives DRF its Retry-After."""

    scope_attr = "throttle_scope"

    def __init__(self) -> None:
        self.decision: Decision | None = None

    @classmethod
    def view_scopes(cls, view_class: Any) -> list[str]:
        """The scopes it decides for a view of this class (read by the status endpoint and the
        drf-spectacular hook, which do not import DRF)."""
        scope = getattr(view_class, cls.scope_attr, None)
        return [scope] if scope else []

    def allow_request(self, request: Any, view: Any) -> bool:
        scope = getattr(view, self.scope_attr, None)
        if not scope:
            return True
        # The DRF request proxies META, GET and POST, and carries DRF's authenticated user.
        self.decision = check(request, scope)
        return self.decision.allowed

    def wait(self) -> float | None:
        if self.decision is None or self.decision.allowed:
            return None
        return max(1.0, self.decision.retry_after)
