"""Drivers of sans-I/O steps: logic written once as a generator of backend calls, run by a
sync driver or an async one (the calls and the awaits are all that differ)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

R = TypeVar("R")
# A step: (method, arguments) of a call on the backend; (None, ()) asks for the backend itself.
Step = tuple[str | None, tuple[Any, ...]]
Steps = Generator[Step, Any, R]


def drive(store: Any, steps: Steps[R], backend_of: Callable[[], Any] | None = None) -> R:
    """Run ``steps`` on a sync backend: each call's value (or exception) goes back into them."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            name, args = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        error = None
        try:
            if name is None:
                value = store = backend_of()  # type: ignore[misc]
            else:
                value = getattr(store, name)(*args)
        except BaseException as exc:
            error = exc


async def adrive(
    store: Any, steps: Steps[R], backend_of: Callable[[], Awaitable[Any]] | None = None
) -> R:
    """drive() on an asyncio backend: each call awaited."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            name, args = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        error = None
        try:
            if name is None:
                value = store = await backend_of()  # type: ignore[misc]
            else:
                value = await getattr(store, name)(*args)
        except BaseException as exc:
            error = exc
