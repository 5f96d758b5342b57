"""Drivers of sans-I/O steps: logic written once as a generator of the calls it needs, run by a
sync driver or an async one (making the calls and awaiting them is all that differs)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

R = TypeVar("R")
# A step: a call to make, with its arguments (a sync callable for drive(), an async one for
# adrive()); (None, ()) asks the driver for the backend (its ``backend_of``).
Step = tuple[Callable[..., Any] | None, tuple[Any, ...]]
Steps = Generator[Step, Any, R]


def drive(steps: Steps[R], backend_of: Callable[[], Any] | None = None) -> R:
    """Run ``steps``: each call's value (or exception) goes back into them. The driver is
    adrive()'s, awaiting nothing: its coroutine ends at its first send."""
    coroutine = _driven(steps, backend_of, False)
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("a sync step suspended")  # a call returned something awaited


async def adrive(steps: Steps[R], backend_of: Callable[[], Awaitable[Any]] | None = None) -> R:
    """drive() with each call awaited."""
    return await _driven(steps, backend_of, True)


async def _driven(steps: Steps[R], backend_of: Callable[[], Any] | None, awaited: bool) -> R:
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            call, args = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        error = None
        try:
            value = call(*args) if call is not None else backend_of()  # type: ignore[misc]
            if awaited:
                value = await value
        except BaseException as exc:
            error = exc
