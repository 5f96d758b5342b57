"""The ``@throttle`` view decorator."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction

from .choices import ALGORITHMS_WITH_BURST, CODE_KEY_KINDS, Algorithm, KeyKind
from .compiled import CONCURRENCY_COUNTS_ALL
from .costs import valid_cost
from .engine import (
    SPECS_ATTR,
    aenforce,
    afailed,
    afinish,
    enforce,
    failed,
    finish,
    serving,
    under_middleware,
)
from .rates import parse_rate
from .rules import DefaultRule, ScopeSpec, register
from .statuses import parse_statuses

V = TypeVar("V", bound=Callable[..., Any])


def throttle(
    scope: str,
    *,
    rate: str | None = None,
    key: str = KeyKind.IP,
    algorithm: str | None = None,
    burst: int | None = None,
    cost: int | Callable[[Any], int] = 1,
    count_statuses: str = "",
) -> Callable[[V], V]:
    """Throttle a view by the admin rules of ``scope``; ``rate=`` is a code default used while
    the admin has no enabled rule for the scope. Its algorithm is, unless given, the sliding
    window counter, or for a rate per week or month the fixed window (calendar windows).
    ``count_statuses`` ("401,403", "4xx"): the code default counts only responses with one of
    these statuses."""
    if not scope or not isinstance(scope, str) or scope[0] in "*/^" or " " in scope:
        raise ValueError(f"@throttle scope {scope!r} must be a name such as 'login'.")
    if key not in CODE_KEY_KINDS:
        raise ValueError(f"@throttle key {key!r} must be one of {', '.join(CODE_KEY_KINDS)}.")
    parsed = parse_rate(rate) if rate is not None else None
    calendar = parsed is not None and parsed.calendar
    if algorithm is None:
        algorithm = Algorithm.FIXED_WINDOW if calendar else Algorithm.SLIDING_WINDOW_COUNTER
    elif calendar and algorithm != Algorithm.FIXED_WINDOW:
        raise ValueError(
            f"@throttle rate {rate!r} is per calendar week or month: only algorithm "
            "fixed_window counts those."
        )
    if algorithm not in Algorithm.values:
        raise ValueError(
            f"@throttle algorithm {algorithm!r} must be one of {', '.join(Algorithm.values)}."
        )
    if burst is not None and algorithm not in ALGORITHMS_WITH_BURST:
        raise ValueError("@throttle burst= needs algorithm token_bucket or leaky_bucket.")
    if not callable(cost):
        cost = valid_cost(cost)  # a function's result is made usable per request: clamped_cost
    _check_statuses(count_statuses, parsed is not None, algorithm)
    default = (
        DefaultRule(scope, parsed, key, algorithm, burst, count_statuses)
        if parsed is not None
        else None
    )
    spec = ScopeSpec(scope, default, cost)
    register(spec)

    def decorator(view: V) -> V:
        specs = [spec, *getattr(view, SPECS_ATTR, ())]
        if iscoroutinefunction(view):

            @wraps(view)
            async def async_wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
                rejection = await aenforce(request, specs)
                if rejection is not None:
                    return rejection
                try:
                    response = await view(request, *args, **kwargs)
                except BaseException as error:
                    if not under_middleware(request):  # else the middleware sees its response
                        await afailed(request, error)
                    raise
                if under_middleware(request):
                    return response  # it writes the headers once, for every decision made
                return await afinish(request, response)

            wrapper: Any = async_wrapper
        else:

            @wraps(view)
            def sync_wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
                # Without the middleware, the view counts the server's threads (MAX_DELAYED).
                threads = serving()
                counted = threads.enter()
                try:
                    rejection = enforce(request, specs)
                    if rejection is not None:
                        return rejection
                    try:
                        response = view(request, *args, **kwargs)
                    except BaseException as error:
                        if not under_middleware(request):  # else the middleware sees its response
                            failed(request, error)
                        raise
                    if under_middleware(request):
                        return response  # it writes the headers once, for every decision made
                    return finish(request, response)
                finally:
                    if counted:
                        threads.leave()

            wrapper = sync_wrapper
        setattr(wrapper, SPECS_ATTR, specs)
        return wrapper  # type: ignore[no-any-return]

    return decorator


def _check_statuses(count_statuses: object, has_rate: bool, algorithm: str) -> None:
    """ValueError, when the decorator is applied, for a count_statuses no default can use."""
    if not isinstance(count_statuses, str):
        raise ValueError(
            f"@throttle count_statuses must be text such as '401,403' or '4xx', "
            f"not {count_statuses!r}."
        )
    try:
        statuses = parse_statuses(count_statuses)
    except ValueError as exc:
        raise ValueError(f"@throttle count_statuses={count_statuses!r}: {exc}.") from None
    if statuses is None:
        return
    if not has_rate:
        raise ValueError(
            "@throttle count_statuses= belongs to the code default: give rate= too (an admin "
            "rule says its own statuses)."
        )
    if algorithm == Algorithm.CONCURRENCY:
        raise ValueError(f"@throttle count_statuses=: {CONCURRENCY_COUNTS_ALL}.")
