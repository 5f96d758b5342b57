"""A django-ninja API throttled at every level: the API, a router, operations (sync and async)."""

from __future__ import annotations

from typing import Any

from ninja import NinjaAPI, Router

from django_throttle import throttle
from django_throttle.contrib.ninja import RuleThrottle, document_limits

api = NinjaAPI(urls_namespace="ninja-tests", throttle=RuleThrottle("ninja-api"))
router = Router(throttle=RuleThrottle("ninja-router"))


@api.get("/items", url_name="ninja-items")
def items(request: Any) -> dict[str, Any]:
    return {"items": [1, 2]}


@api.get("/async-items", url_name="ninja-async-items")
async def async_items(request: Any) -> dict[str, Any]:
    return {"items": [1, 2]}


@api.get("/orders", throttle=RuleThrottle("ninja-orders"))
def orders(request: Any) -> dict[str, Any]:
    return {"orders": []}


@api.get("/paths", throttle=RuleThrottle())
def paths(request: Any) -> dict[str, Any]:
    return {"paths": True}


@api.get("/async-paths", throttle=RuleThrottle())
async def async_paths(request: Any) -> dict[str, Any]:
    return {"paths": True}


@api.get("/decorated", throttle=[])
@throttle("ninja-decorated", rate="2/m")
def decorated(request: Any) -> dict[str, Any]:
    return {"decorated": True}


@api.get("/free", throttle=[])
def free(request: Any) -> dict[str, Any]:
    return {"free": True}


@router.get("/reports")
def reports(request: Any) -> dict[str, Any]:
    return {"reports": []}


@router.get("/async-reports")
async def async_reports(request: Any) -> dict[str, Any]:
    return {"reports": []}


api.add_router("/r", router)
document_limits(api)
