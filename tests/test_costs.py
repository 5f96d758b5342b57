"""A cost that is not a positive whole number raises the same ValueError at every entry point."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.test import RequestFactory

from django_throttle import acheck, check, check_key, refund, refund_key, throttle

BAD_COSTS = [0, -1, 1.5, True, "2"]
MESSAGE = "cost must be a positive whole number"

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("cost", BAD_COSTS)
def test_check_raises_for_a_cost_that_is_not_a_positive_whole_number(cost: Any) -> None:
    with pytest.raises(ValueError, match=MESSAGE):
        check(RequestFactory().get("/"), "login", cost=cost)


@pytest.mark.parametrize("cost", BAD_COSTS)
def test_every_entry_point_says_the_same(cost: Any) -> None:
    request = RequestFactory().get("/")
    for call in (
        lambda: asyncio.run(acheck(request, "login", cost=cost)),
        lambda: check_key("login", "tenant:1", cost=cost),
        lambda: refund(request, "login", cost=cost),
        lambda: refund_key("login", "tenant:1", cost=cost),
        lambda: throttle("login", cost=cost),
    ):
        with pytest.raises(ValueError, match=MESSAGE):
            call()
