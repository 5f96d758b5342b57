"""Views of the demo site, one for each way of throttling."""

import asyncio
import csv

from django.contrib.auth import authenticate, login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle import throttle

ITEMS = [{"id": n, "name": f"item {n}"} for n in range(1, 51)]


def home(request: HttpRequest) -> HttpResponse:
    return render(request, "demo/home.html")


def api_items(request: HttpRequest) -> JsonResponse:
    """Covered by the path-prefix rules of scope '/api/' (no decorator needed)."""
    return JsonResponse({"items": ITEMS[:10]})


def item_detail(request: HttpRequest, pk: int) -> JsonResponse:
    """Covered by the regular-expression rule '^/items/\\d+/$'."""
    return JsonResponse(ITEMS[(pk - 1) % len(ITEMS)])


def login_view(request: HttpRequest) -> HttpResponse:
    """A failed attempt answers 401, which the rule 'login-failures' (count only responses
    401) counts; it counts every attempt before the view, so parallel guesses cannot all get
    through, and its 429s are on the dashboard."""
    if request.method == "POST":
        user = authenticate(
            request,
            username=request.POST.get("username", ""),
            password=request.POST.get("password", ""),
        )
        if user is not None:
            login(request, user)
            return redirect("home")
        error = "Wrong username or password."
        return render(request, "demo/login.html", {"error": error}, status=401)
    return render(request, "demo/login.html")


@throttle("search", rate="30/m", key="user_or_ip", algorithm="sliding_window_counter")
def search(request: HttpRequest) -> JsonResponse:
    """A code default (30/m) until the admin has an enabled rule of scope 'search'."""
    query = request.GET.get("q", "").strip().lower()
    return JsonResponse({"q": query, "results": [i for i in ITEMS if query in i["name"]]})


@throttle("export", cost=5)
def export(request: HttpRequest) -> HttpResponse:
    """An expensive view: each request costs 5 from the 'export' rules."""
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = 'attachment; filename="items.csv"'
    writer = csv.writer(response)
    writer.writerow(["id", "name"])
    for item in ITEMS:
        writer.writerow([item["id"], item["name"]])
    return response


@throttle("report", rate="5/m", key="ip", algorithm="token_bucket", burst=2)
async def report(request: HttpRequest) -> JsonResponse:
    """An async view: under ASGI its decision uses the asyncio Redis client."""
    await asyncio.sleep(0)
    return JsonResponse({"report": "ready"})


class Orders(APIView):
    """A DRF view throttled by the admin rules of its throttle_scope."""

    throttle_scope = "orders"

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        return Response({"orders": []})
