"""Deadlines on an event loop that time the store, not the loop.

A timer on a busy loop fires when the loop gets round to it: what it guards may have been
answered long before, the reply waiting in the socket or the connect made, while the loop ran
other requests' code. So when a deadline passes, the socket is asked first: with bytes waiting
to be read (for a connect, the connection made or refused), the loop is behind and not the
store, and it gets one more turn, whose I/O is read before the deadline looks again. Only an
operation the server has said nothing to fails."""

from __future__ import annotations

import asyncio
import select
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

# Where nothing can be asked of a socket (redis.asyncio's connect, until its transport exists),
# a deadline that fires late is moved on by its lateness: what the loop took from it. At most
# this many times the timeout, so a dead server on a loop busy for good still fails.
MAX_STRETCH = 4.0
# Later than this, a timer was held up by the loop's work (a quiet loop runs one within about
# a millisecond of its time).
LATE = 0.01


def _polled(sock: Any, events: int) -> bool:
    if sock is None:
        return False
    try:
        poll = select.poll()
        poll.register(sock.fileno(), events)
        return bool(poll.poll(0))
    except (OSError, ValueError):  # closed under us: the loop reports it on its next turn
        return True


def waiting(sock: Any) -> bool:
    """Whether bytes, or the peer's close, wait to be read on ``sock`` (nothing is read)."""
    return _polled(sock, select.POLLIN)


def connected(sock: Any) -> bool:
    """Whether a non-blocking connect on ``sock`` has ended, made or refused."""
    return _polled(sock, select.POLLOUT)


def answered_on(conn: Any) -> bool:
    """Whether bytes from the server wait on a redis.asyncio connection: still in the socket,
    or read by the loop into its stream while no read waits on it. Part of a reply that a read
    waits on (redis-py's own parser reads whole lines and lengths) is not an answer: if
    nothing more comes, the deadline passes."""
    reader = getattr(conn, "_reader", None)
    if getattr(reader, "_buffer", None) and getattr(reader, "_waiter", None) is None:
        return True
    writer = getattr(conn, "_writer", None)
    return writer is not None and waiting(writer.transport.get_extra_info("socket"))


class Deadline:
    """Calls ``expire`` once ``seconds`` have passed and ``answered()`` says the server has not
    answered (see the module); else looks again after the loop's next turn. ``stretch``: the
    lateness of the timer is added to it, up to MAX_STRETCH times ``seconds``."""

    __slots__ = ("answered", "expire", "handle", "loop", "stretch")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        seconds: float,
        answered: Callable[[], bool],
        expire: Callable[[], None],
        stretch: bool = False,
    ) -> None:
        self.loop = loop
        self.answered = answered
        self.expire = expire
        self.stretch = seconds * MAX_STRETCH if stretch else 0.0
        self.handle = loop.call_at(loop.time() + seconds, self._due)

    def _due(self) -> None:
        loop = self.loop
        now = loop.time()
        if self.answered():
            # call_at(now) runs on the next turn after its I/O callbacks: what waits is read
            # before this looks again.
            self.handle = loop.call_at(now, self._due)
            return
        late = now - self.handle.when()
        if LATE < late <= self.stretch:
            self.stretch -= late
            self.handle = loop.call_at(now + late, self._due)
            return
        self.expire()

    def cancel(self) -> None:
        self.handle.cancel()


async def within(
    seconds: float | None,
    awaitable: Awaitable[T],
    answered: Callable[[], bool],
    error: Callable[[], Exception],
    stretch: bool = False,
) -> T:
    """``awaitable``, cancelled by a Deadline and then raising ``error()`` instead (a cancel
    from elsewhere goes on as it is)."""
    if seconds is None:
        return await awaitable
    task = asyncio.current_task()
    assert task is not None
    # Python 3.10 counts no cancellations (and has no uncancel).
    cancelling = getattr(task, "cancelling", lambda: 0)()
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    deadline = Deadline(asyncio.get_running_loop(), seconds, answered, expire, stretch)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if expired and getattr(task, "uncancel", lambda: 0)() <= cancelling:
            raise error() from None
        raise
    finally:
        deadline.cancel()
