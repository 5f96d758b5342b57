"""The rejection log's counts in Redis: push.lua and take.lua on the store's client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from redis.exceptions import NoScriptError

from .redis import load_lua, sha1

PUSH_SOURCE = load_lua("push.lua")
PUSH_SHA = sha1(PUSH_SOURCE)
TAKE_SOURCE = load_lua("take.lua")
TAKE_SHA = sha1(TAKE_SOURCE)


class CountsLink:
    """The store's client as the rejection log uses it (GuardedStore.counts_link()): its
    errors are the store's, for the log to keep its counts."""

    __slots__ = ("_client",)

    def __init__(self, client: Any) -> None:
        self._client = client

    def push(self, keys: list[str], args: list[Any]) -> Any:
        """push.lua: add counts to the waiting hash."""
        return self._run(PUSH_SHA, PUSH_SOURCE, keys, args)

    def take(self, keys: list[str], args: list[Any]) -> Any:
        """take.lua: rename the waiting hash for one fold."""
        return self._run(TAKE_SHA, TAKE_SOURCE, keys, args)

    def scan(self, key: str, count: int) -> Iterator[tuple[bytes, bytes]]:
        """The fields of a hash (HSCAN: a field may come twice)."""
        return self._client.hscan_iter(key, count=count)  # type: ignore[no-any-return]

    def delete(self, key: str) -> None:
        self._client.delete(key)

    def _run(self, sha: str, source: str, keys: list[str], args: list[Any]) -> Any:
        try:
            return self._client.evalsha(sha, len(keys), *keys, *args)
        except NoScriptError:  # after a restart, a failover or SCRIPT FLUSH
            self._client.script_load(source)
            return self._client.evalsha(sha, len(keys), *keys, *args)
