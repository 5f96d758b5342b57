"""The Redis backend: every check of a request in one EVALSHA of decide.lua."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

from ..compiled import CompiledRule
from ..conf import conf
from ..keyspace import ALGORITHM_CODES, digest
from .base import Check, Result, state_key
from .connections import ConnectionStack

US = 1_000_000


def load_lua(name: str) -> str:
    return resources.files("django_throttle.store").joinpath("lua", name).read_text("utf-8")


class RedisStore:
    """Decisions in Redis. The client comes from django-redis, so Redis is configured in CACHES."""

    def __init__(self, client: Any, owns_pool: bool = False) -> None:
        self.client = client  # everything but the decision itself: reset, script load, version
        self.owns_pool = owns_pool
        stack = ConnectionStack.for_pool(getattr(client, "connection_pool", None))
        # One command on the decision connections: the lean path where the pool allows it.
        self.execute = stack.execute if stack is not None else client.execute_command
        self._stack = stack

    @classmethod
    def from_cache(cls, alias: str) -> RedisStore:
        client, owned = client_from_cache(alias)
        return cls(client, owns_pool=owned)

    def close(self) -> None:
        """Close the store's own connections (never those of django-redis's pool)."""
        if self._stack is not None:
            self._stack.disconnect()
        if self.owns_pool:
            self.client.connection_pool.disconnect()

    def decide(self, checks: Sequence[Check], dry_run: bool = False) -> list[Result]:
        if not checks:
            return []
        keys, args = script_input(checks, dry_run)
        # EVALSHA straight away (redis-py's Script wrapper costs more per call than our
        # whole Python side); the script is loaded on NOSCRIPT, after SCRIPT FLUSH or a
        # restart of the server.
        execute = self.execute
        try:
            reply = execute("EVALSHA", DECIDE_SHA, len(keys), *keys, *args)
        except NoScriptError:
            self.client.script_load(DECIDE_SOURCE)
            reply = execute("EVALSHA", DECIDE_SHA, len(keys), *keys, *args)
        return parse_reply(checks, reply)

    def reset(self, rule: CompiledRule, identity: str) -> None:
        self.client.delete(state_key(rule, identity))


class AsyncRedisStore:
    """The same decisions through redis.asyncio, so an ASGI event loop never blocks on Redis."""

    def __init__(self, client: Any) -> None:
        self.client = client

    @classmethod
    def from_cache(cls, alias: str) -> AsyncRedisStore:
        return cls(async_client_from_cache(alias))

    async def decide(self, checks: Sequence[Check], dry_run: bool = False) -> list[Result]:
        if not checks:
            return []
        keys, args = script_input(checks, dry_run)
        try:
            reply = await self.client.evalsha(DECIDE_SHA, len(keys), *keys, *args)
        except NoScriptError:
            await self.client.script_load(DECIDE_SOURCE)
            reply = await self.client.evalsha(DECIDE_SHA, len(keys), *keys, *args)
        return parse_reply(checks, reply)

    async def reset(self, rule: CompiledRule, identity: str) -> None:
        await self.client.delete(state_key(rule, identity))


def client_from_cache(alias: str) -> tuple[Any, bool]:
    """A client for the server of a django-redis cache, with the decision timeouts.

    A throttling call must not inherit a cache's timeouts (often seconds, or none)
    or redis-py's retries with backoff: a hung server would stall every request.
    The connection settings (host, port, db, password, TLS...) are the cache's own.
    """
    from django_redis import get_redis_connection
    from redis import ConnectionPool, Redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    base = get_redis_connection(alias)
    pool = base.connection_pool
    if type(pool) is not ConnectionPool:
        return base, False  # Sentinel and other pools: used as django-redis built them
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(
        socket_timeout=conf.TIMEOUT,
        socket_connect_timeout=conf.CONNECT_TIMEOUT,
        retry=Retry(NoBackoff(), 0),
    )
    kwargs.pop("retry_on_timeout", None)
    client = Redis(
        connection_pool=ConnectionPool(
            connection_class=pool.connection_class,
            max_connections=pool.max_connections,
            **kwargs,
        )
    )
    return client, True


def async_client_from_cache(alias: str) -> Any:
    """A redis.asyncio client for the server of a django-redis cache, with its options and
    the decision timeouts."""
    import redis.asyncio
    from django.conf import settings
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    config: dict[str, Any] = settings.CACHES[alias]  # project settings: any shape
    location = config["LOCATION"]
    if isinstance(location, (list, tuple)):
        location = location[0]  # django-redis writes to the first server
    options = config.get("OPTIONS", {})
    kwargs: dict[str, Any] = dict(options.get("CONNECTION_POOL_KWARGS", {}))
    if options.get("PASSWORD"):
        kwargs["password"] = options["PASSWORD"]
    kwargs.update(
        socket_timeout=conf.TIMEOUT,
        socket_connect_timeout=conf.CONNECT_TIMEOUT,
        retry=Retry(NoBackoff(), 0),
    )
    return redis.asyncio.Redis.from_url(location, **kwargs)


def script_input(checks: Sequence[Check], dry_run: bool) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of decide.lua (see its header)."""
    # Redis Cluster: every key carries the same hash tag (state_prefix), so one call
    # is valid. To spread rules over slots, group the checks by slot here and make
    # one call per group, giving up all-or-nothing across groups.
    keys = []
    args: list[Any] = ["1" if dry_run else "0"]
    digests: dict[str, str] = {}  # the rules of a request often key on one identity
    for check in checks:
        rule = check.rule
        who = check.identity
        hashed = digests.get(who)
        if hashed is None:
            hashed = digests[who] = digest(who)
        keys.append(rule.state_prefix + hashed)
        args += (
            ALGORITHM_CODES[rule.algorithm],
            rule.limit,
            rule.period,
            rule.burst,
            check.cost,
            "1" if rule.enforcing else "0",
        )
    return keys, args


def parse_reply(checks: Sequence[Check], reply: Sequence[int]) -> list[Result]:
    now = reply[0] / US
    results = []
    i = 2
    for check in checks:
        allowed, remaining, reset_after, retry_after, delay = reply[i : i + 5]
        i += 5
        results.append(
            Result(
                rule=check.rule,
                identity=check.identity,
                allowed=allowed == 1,
                limit=check.rule.limit,
                remaining=remaining,
                reset_at=now + reset_after / US,
                retry_after=retry_after / US,
                delay=delay / US,
            )
        )
    return results


DECIDE_SOURCE = load_lua("decide.lua")
DECIDE_SHA = hashlib.sha1(DECIDE_SOURCE.encode("utf-8")).hexdigest()
