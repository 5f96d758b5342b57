# api.py: an API whose URLs are path("api/", api.urls) in urls.py
from ninja import NinjaAPI, Router

from django_throttle.contrib.ninja import RuleThrottle, document_limits

api = NinjaAPI(throttle=RuleThrottle("api"))  # every operation: scope "api"
reports = Router(throttle=RuleThrottle("reports"))  # this router's operations


@api.get("/orders", throttle=RuleThrottle("orders"))  # this operation only
def orders(request):
    return [{"id": 1}]


@api.get("/search", throttle=RuleThrottle())  # the rules of its path and URL name
async def search(request, q: str):
    return {"q": q, "results": []}


@reports.get("/daily")  # the router's throttle: scope "reports"
def daily(request):
    return {"report": "daily"}


api.add_router("/reports", reports)
document_limits(api)  # the limits in the API's OpenAPI schema
