"""A rule whose methods include GET counts HEAD too: Django serves HEAD with the GET view."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views import View

from django_throttle.compiled import compile_rule
from django_throttle.models import Rule
from tests.helpers import rule

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.urls("tests.test_head"),
    pytest.mark.usefixtures("throttle_middleware"),
]

ran: list[str] = []


class Counted(View):
    """A GET view: Django's View answers HEAD with it."""

    def get(self, request: HttpRequest) -> HttpResponse:
        ran.append(request.method or "")
        return HttpResponse("counted")


urlpatterns = [path("counted/", Counted.as_view(), name="counted")]


@pytest.mark.parametrize("scope", ["/counted/", "counted"], ids=["path-prefix", "url-name"])
def test_a_get_rule_counts_head(client: Any, scope: str) -> None:
    ran.clear()
    rule("pages", scope, 3, methods="GET", algorithm="fixed_window")
    methods = list(itertools.islice(itertools.cycle(["get", "head"]), 8))
    codes = [getattr(client, method)("/counted/").status_code for method in methods]
    assert codes == [200, 200, 200, 429, 429, 429, 429, 429]
    assert ran == ["GET", "HEAD", "GET"]


def test_head_is_added_at_compile_time_to_get_only() -> None:
    def methods(written: str) -> frozenset[str] | None:
        return compile_rule(Rule(pk=1, name="r", scope="*", methods=written, limit=1)).methods

    assert methods("GET") == {"GET", "HEAD"}
    assert methods("POST,GET") == {"POST", "GET", "HEAD"}
    assert methods("POST") == {"POST"}
    assert methods("HEAD") == {"HEAD"}
    assert methods("") is None
