"""A django-ninja API of the demo, throttled by the admin's rules and described with its limits
in its OpenAPI schema (/ninja/openapi.json, /ninja/docs)."""

from __future__ import annotations

from typing import Any

from ninja import NinjaAPI

from django_throttle.contrib.ninja import RuleThrottle, document_limits

from .views import ITEMS

api = NinjaAPI(title="django-throttle demo", throttle=RuleThrottle("ninja"))


@api.get("/items", url_name="ninja-items")
def items(request: Any) -> list[dict[str, Any]]:
    """Every operation: rule "ninja" (the API's RuleThrottle("ninja"))."""
    return ITEMS[:10]


@api.get("/items/{pk}", url_name="ninja-item")
async def item(request: Any, pk: int) -> dict[str, Any]:
    """An async operation, under the same rule."""
    return ITEMS[(pk - 1) % len(ITEMS)]


@api.get("/open", throttle=[], url_name="ninja-open")
def open_operation(request: Any) -> dict[str, bool]:
    """No RuleThrottle: only the rules of its path (the demo's "site", scope '*')."""
    return {"open": True}


document_limits(api)
