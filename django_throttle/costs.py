"""A cost: how much of a rule one event uses, checked the same way by every entry point."""

from __future__ import annotations

from typing import Any


def valid_cost(cost: object) -> int:
    """The cost if it is a positive whole number; ValueError otherwise."""
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
        raise ValueError(f"cost must be a positive whole number, not {cost!r}")
    return cost


def clamped_cost(cost: Any) -> int:
    """A cost computed from a request (``@throttle(cost=function)``), made usable: at least 1.

    Not valid_cost(): the function runs on every request, and a bad value from it (0, a float)
    must not turn a request into a 500; a constant cost is checked by valid_cost() when the
    decorator is applied."""
    return max(1, int(cost))
