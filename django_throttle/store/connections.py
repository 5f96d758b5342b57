"""Connections for the decision call: one command, one reply, nothing else on the way.

redis-py's ``Redis.execute_command`` wraps every command in retry, pool locking,
a readiness check and observability hooks; on a loopback that costs about a third
of the round trip (docs/benchmarks.md). The decision call needs none of it: it
has no retries (a failure goes to the circuit breaker), and its pool is private.
So the store keeps its connections on a stack and talks to each through
redis-py's ``Connection`` (which still does the handshake, AUTH, SELECT, TLS and
RESP parsing, and disconnects itself on any error).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from redis import ConnectionPool
from redis.exceptions import ConnectionError, ResponseError

_stacks: weakref.WeakSet[ConnectionStack] = weakref.WeakSet()


class ConnectionStack:
    """Idle connections, most recently used first, made as the pool's own would be.

    As many connections exist as decisions ever ran at once in this process (a
    thread holds one for a single command), like redis-py's pool. list.pop and
    list.append are atomic, so no lock is taken.
    """

    def __init__(self, pool: ConnectionPool) -> None:
        self._connection_class = pool.connection_class
        self._kwargs = dict(pool.connection_kwargs)
        self._idle: list[Any] = []
        _stacks.add(self)

    @classmethod
    def for_pool(cls, pool: Any) -> ConnectionStack | None:
        """A stack for a plain pool; None for Sentinel, other custom or client-side-caching
        pools, or a client without a pool: those keep redis-py's own path."""
        if type(pool) is not ConnectionPool or getattr(pool, "cache", None) is not None:
            return None
        return cls(pool)

    def execute(self, *args: Any) -> Any:
        """Send one command and return its reply; Redis errors are raised as redis-py raises them."""
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._connection_class(**self._kwargs)
        else:
            # Every idle connection finished its last command. One that reads as ready
            # before we sent anything was closed by the server (restart, idle timeout):
            # reconnect, as redis-py's pool does, instead of failing this request on it.
            try:
                stale = conn.can_read()
            except ConnectionError:
                stale = True
            if stale:
                conn.disconnect()
        try:
            conn.send_packed_command(conn.pack_command(*args))  # connects a new one
            reply = conn.read_response()
        except ResponseError:
            self._idle.append(conn)  # an error reply was read whole: the connection is sound
            raise
        except BaseException:
            conn.disconnect()  # timed out or broken halfway: never reused
            raise
        self._idle.append(conn)
        return reply

    def disconnect(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.disconnect()

    def _forget(self) -> None:
        # In a forked child the sockets are the parent's: drop them without a word on the
        # wire (redis-py's Connection only closes the child's descriptor).
        self._idle = []


def _after_fork() -> None:
    for stack in list(_stacks):
        stack._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
