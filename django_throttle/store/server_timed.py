"""redis.asyncio connections whose connect and replies are timed by the server's answer
(store/deadlines.py) instead of redis-py's timers, which time the event loop: for the
connections redis.asyncio opens itself to ask the Sentinels for the primary, or to read a
cluster's slot map. The decisions' own connections are the stacks' (connections.py,
aio_connection.py)."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any, NamedTuple

from redis.exceptions import TimeoutError as RedisTimeoutError

from .deadlines import MAX_STRETCH, answered_on, within

_MADE: dict[type, type] = {}


def server_timed(connection_class: type) -> type:
    """A subclass of redis.asyncio's ``connection_class`` (plain, TLS or Unix socket) that
    takes the socket timeouts it is given as deadlines timed by the server's answer: the
    connect, stretched while the loop is late (until its socket exists it cannot be asked),
    and each reply not read by the time the server has said nothing. Made once per class."""
    if getattr(connection_class, "plain", None) is not None:
        return connection_class  # already one
    made = _MADE.get(connection_class)
    if made is not None:
        return made

    class ServerTimed(connection_class):  # type: ignore[misc]
        plain = connection_class

        def __init__(self, **kwargs: Any) -> None:
            timeout = kwargs.get("socket_timeout")
            connect = kwargs.get("socket_connect_timeout") or timeout
            self._reply_deadline: float | None = timeout
            self._connect_deadline: float | None = connect
            # redis-py's own connect timer, which also bounds waiting for a close, only as a
            # backstop: twice the most the deadline can stretch to.
            backstop = None if connect is None else 2 * (1 + MAX_STRETCH) * connect
            super().__init__(
                **{**kwargs, "socket_timeout": None, "socket_connect_timeout": backstop}
            )

        async def _connect(self) -> None:
            await within(
                self._connect_deadline,
                super()._connect(),
                partial(answered_on, self),
                # What redis-py's own connect timer raises: it reports a timed-out connect.
                asyncio.TimeoutError,
                stretch=True,
            )

        async def read_response(self, *args: Any, **kwargs: Any) -> Any:
            if (len(args) > 1 and args[1] is not None) or kwargs.get("timeout") is not None:
                # A caller's own timeout (redis-py's blocking reads): redis-py's timer.
                return await super().read_response(*args, **kwargs)
            return await within(
                self._reply_deadline,
                super().read_response(*args, **kwargs),
                partial(answered_on, self),
                lambda: RedisTimeoutError("Timeout reading from the store"),
            )

    ServerTimed.__name__ = ServerTimed.__qualname__ = f"ServerTimed{connection_class.__name__}"
    _MADE[connection_class] = ServerTimed
    return ServerTimed


class PlainOptions(NamedTuple):
    """A node's connection options with the redis.asyncio class a server_timed() one was
    made from: what the decision stacks make their connections from (they time their own)."""

    connection_class: type
    connection_kwargs: dict[str, Any]


def plain_options(node: Any) -> PlainOptions:
    cls = node.connection_class
    return PlainOptions(getattr(cls, "plain", None) or cls, node.connection_kwargs)


def time_by_server(manager: Any) -> None:
    """Have redis.asyncio's cluster NodesManager open server_timed() connections: the nodes it
    has, and those it makes from its connection options when it reads the slot map."""
    kwargs = manager.connection_kwargs
    kwargs["connection_class"] = server_timed(kwargs["connection_class"])  # always set
    for nodes in (manager.startup_nodes, manager.nodes_cache):
        for node in nodes.values():
            node.connection_class = server_timed(node.connection_class)
