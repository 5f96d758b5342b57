"""What a store call raises when the store, not the caller, is at fault."""

from __future__ import annotations

import re

from redis.exceptions import ConnectionError, RedisClusterException, RedisError

# Everything a Redis call raises when the server is down, hung, full, read-only,
# loading, or answers a script error: redis-py wraps these in RedisError, apart from
# socket-level OSErrors and a cluster it cannot map (RedisClusterException).
STORE_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError, RedisClusterException)

# How redis-py (sync, asyncio) and the lean connection word a connection that was made and
# answered, then cut by the server or the network mid-command: closed, reset, a broken pipe.
# A connect that fails ("Error 111 connecting to ...") or a timeout is not one of these.
_CUT = re.compile(
    r"closed by|Connection reset|reset by peer|Broken pipe|while reading from|"
    r"while writing to socket|Error 32 |Error 104 ",
    re.IGNORECASE,
)


def cut(exc: BaseException) -> bool:
    """Whether a store call failed because its connection was cut mid-command (a server that
    closes its clients' connections as Sentinel demotes it, a restart), not because the
    server could not be reached or did not answer in time."""
    if not isinstance(exc, (ConnectionError, OSError)) or isinstance(exc, TimeoutError):
        return False
    if isinstance(exc, ConnectionError) and type(exc).__name__ != "ConnectionError":
        return False  # its subclasses say more: no primary known, no permission, loading
    text = str(exc)
    return "connecting" not in text and _CUT.search(text) is not None


def describe(exc: BaseException) -> str:
    """An error for the log: its class and its words (redis-py 8's repr() drops the words)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
