"""Views of the demo site: an API, a login form, a search and an expensive export."""

import csv

from django.contrib.auth import authenticate, login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render

ITEMS = [{"id": n, "name": f"item {n}"} for n in range(1, 51)]


def home(request: HttpRequest) -> HttpResponse:
    return render(request, "demo/home.html")


def api_items(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"items": ITEMS[:10]})


def login_view(request: HttpRequest) -> HttpResponse:
    error = None
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
    return render(request, "demo/login.html", {"error": error}, status=400 if error else 200)


def search(request: HttpRequest) -> JsonResponse:
    query = request.GET.get("q", "").strip().lower()
    return JsonResponse({"q": query, "results": [i for i in ITEMS if query in i["name"]]})


def export(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = 'attachment; filename="items.csv"'
    writer = csv.writer(response)
    writer.writerow(["id", "name"])
    for item in ITEMS:
        writer.writerow([item["id"], item["name"]])
    return response
