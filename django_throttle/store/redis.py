"""The Redis backend: every check of a request in one EVALSHA of decide.lua."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from importlib import resources
from typing import Any, NamedTuple
from urllib.parse import unquote, urlparse

import redis.asyncio
import redis.asyncio.connection
import redis.asyncio.sentinel
from redis import ConnectionPool, Redis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from ..choices import ALGORITHMS_WITH_BURST
from ..compiled import CompiledRule
from ..conf import conf
from ..state_keys import ALGORITHM_CODES, BLOCK_SUFFIX, CALENDAR_CODE, client_tag
from .aio_connection import async_stack
from .base import Check, Result, state_key
from .connections import ConnectionStack
from .wire import array, bulk

US = 1_000_000
REPLY_FIELDS = 4  # per check in decide.lua's reply
CLOCK_MISS = -1  # decide.lua's "admitted" when its time is outside a check's calendar windows

ASYNC_STACKABLE_POOLS = (
    redis.asyncio.connection.ConnectionPool,
    redis.asyncio.sentinel.SentinelConnectionPool,
)


def load_lua(name: str) -> str:
    return resources.files("django_throttle.store").joinpath("lua", name).read_text("utf-8")


class RedisStore:
    """Decisions in Redis. The client comes from django-redis, so Redis is configured in CACHES."""

    def __init__(self, client: Any, owns_pool: bool = False) -> None:
        self.client = client  # everything but the decision itself: reset, version
        self.owns_pool = owns_pool
        stack = ConnectionStack.for_pool(getattr(client, "connection_pool", None))
        # The lean path where the pool allows it; redis-py's own for other pools.
        self._run = stack.run_script if stack is not None else self._run_on_client
        self._stack = stack
        self.clock = ServerClock()

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

    def _run_on_client(self, sha: str, source: str, *args: Any) -> Any:
        try:
            return self.client.execute_command("EVALSHA", sha, *args)
        except NoScriptError:
            self.client.script_load(source)
            return self.client.execute_command("EVALSHA", sha, *args)

    def decide(self, checks: Sequence[Check], dry_run: bool = False) -> list[Result]:
        if not checks:
            return []
        reply = self._decide(checks, dry_run)
        if self.clock.missed(reply):
            reply = self._decide(checks, dry_run)
        return parse_reply(checks, reply)

    def _decide(self, checks: Sequence[Check], dry_run: bool) -> Any:
        # EVALSHA straight away (redis-py's Script wrapper costs more per call than our
        # whole Python side); the script is loaded on NOSCRIPT, after SCRIPT FLUSH, a
        # restart or a failover, on the connection that reported it.
        if self._stack is not None:
            return self._stack.run_packed(packed_decide(checks, dry_run, self.clock), DECIDE_SOURCE)
        return self._run_on_client(
            DECIDE_SHA, DECIDE_SOURCE, *decide_input(checks, dry_run, self.clock)
        )

    def reset(self, rule: CompiledRule, identity: str) -> None:
        key = state_key(rule, identity)
        self.client.delete(key, key + BLOCK_SUFFIX)

    def refund(self, checks: Sequence[Check], at: int = 0) -> None:
        if checks:
            self._run(REFUND_SHA, REFUND_SOURCE, *refund_input(checks, at))

    def block(self, checks: Sequence[Check], seconds: int) -> None:
        if checks:
            self._run(BLOCK_SHA, BLOCK_SOURCE, *block_input(checks, seconds))


class AsyncRedisStore:
    """The same decisions through redis.asyncio, so an ASGI event loop never blocks on Redis."""

    def __init__(self, client: Any) -> None:
        self.client = client
        pool = getattr(client, "connection_pool", None)
        stackable = type(pool) in ASYNC_STACKABLE_POOLS
        self._stack = async_stack(pool, one_deadline=True) if stackable else None
        self.clock = ServerClock()

    @classmethod
    def from_cache(cls, alias: str) -> AsyncRedisStore:
        return cls(async_client_from_cache(alias))

    async def aclose(self) -> None:
        if self._stack is not None:
            await self._stack.disconnect()
        await self.client.aclose()
        manager = getattr(self.client.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()

    async def decide(self, checks: Sequence[Check], dry_run: bool = False) -> list[Result]:
        if not checks:
            return []
        stack = self._stack
        if stack is not None:  # awaited here: each coroutine on the way costs on the hot path
            packed = packed_decide(checks, dry_run, self.clock)
            reply = await stack.run_packed(packed, DECIDE_SOURCE)
        else:
            reply = await self._decide(checks, dry_run)
        if self.clock.missed(reply):
            reply = await self._decide(checks, dry_run)
        return parse_reply(checks, reply)

    async def _decide(self, checks: Sequence[Check], dry_run: bool) -> Any:
        if self._stack is not None:
            return await self._stack.run_packed(
                packed_decide(checks, dry_run, self.clock), DECIDE_SOURCE
            )
        return await self._run(DECIDE_SHA, DECIDE_SOURCE, decide_input(checks, dry_run, self.clock))

    async def refund(self, checks: Sequence[Check], at: int = 0) -> None:
        if checks:
            await self._run(REFUND_SHA, REFUND_SOURCE, refund_input(checks, at))

    async def _run(self, sha: str, source: str, args: list[Any]) -> Any:
        if self._stack is not None:
            return await self._stack.run_script(sha, source, *args)
        try:
            return await self.client.evalsha(sha, *args)
        except NoScriptError:
            await self.client.script_load(source)
            return await self.client.evalsha(sha, *args)

    async def reset(self, rule: CompiledRule, identity: str) -> None:
        key = state_key(rule, identity)
        await self.client.delete(key, key + BLOCK_SUFFIX)


def decision_kwargs() -> dict[str, Any]:
    """Connection options every decision client gets, whatever the cache's.

    A throttling call must not inherit a cache's timeouts (often seconds, or none)
    or redis-py's retries with backoff: a hung server would stall every request.
    """
    return {
        "socket_timeout": conf.TIMEOUT,
        "socket_connect_timeout": conf.CONNECT_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),
    }


def _with_decision_timeouts(connection_kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(connection_kwargs)
    kwargs.pop("retry_on_timeout", None)
    kwargs.pop("connection_pool", None)  # Sentinel's back reference to its own pool
    kwargs.update(decision_kwargs())
    return kwargs


def client_from_cache(alias: str) -> tuple[Any, bool]:
    """A client for the server of a django-redis cache, with the decision timeouts.

    The connection settings (host, port, db, password, TLS, Sentinels...) are the
    cache's own. Returns the client and whether the store owns its pool.
    """
    from django_redis import get_redis_connection

    base = get_redis_connection(alias)
    pool = base.connection_pool
    kwargs = _with_decision_timeouts(pool.connection_kwargs)
    if type(pool) is ConnectionPool:
        new_pool: Any = ConnectionPool(
            connection_class=pool.connection_class, max_connections=pool.max_connections, **kwargs
        )
    elif type(pool) is SentinelConnectionPool:
        # django-redis's SentinelConnectionFactory: the same service and Sentinels, asked
        # with the decision timeouts too (a new connection asks them for the primary).
        old = pool.sentinel_manager
        addresses = [s.connection_pool.connection_kwargs for s in old.sentinels]
        manager = Sentinel(  # type: ignore[no-untyped-call]
            [(a["host"], a["port"]) for a in addresses],
            min_other_sentinels=old.min_other_sentinels,
            sentinel_kwargs=_with_decision_timeouts(old.sentinel_kwargs),
        )
        new_pool = SentinelConnectionPool(  # type: ignore[no-untyped-call]
            pool.service_name,
            manager,
            connection_class=pool.connection_class,
            max_connections=pool.max_connections,
            is_master=pool.is_master,
            check_connection=pool.check_connection,
            **kwargs,
        )
    else:
        return base, False  # other pools: used as django-redis built them
    return Redis(connection_pool=new_pool), True


def async_client_from_cache(alias: str) -> Any:
    """A redis.asyncio client for the server of a django-redis cache, with its options and
    the decision timeouts; through its Sentinels if the cache has ``OPTIONS["SENTINELS"]``."""
    from django.conf import settings

    config: dict[str, Any] = settings.CACHES[alias]  # project settings: any shape
    location = config["LOCATION"]
    if isinstance(location, (list, tuple)):
        location = location[0]  # django-redis writes to the first server
    options = config.get("OPTIONS", {})
    kwargs: dict[str, Any] = dict(options.get("CONNECTION_POOL_KWARGS", {}))
    if options.get("PASSWORD"):
        kwargs["password"] = options["PASSWORD"]
    kwargs.update(decision_kwargs(), retry=AsyncRetry(NoBackoff(), 0))
    sentinels = options.get("SENTINELS")
    if not sentinels:
        return redis.asyncio.Redis.from_url(location, **kwargs)

    # LOCATION names the service, as django-redis reads it: redis://[:password@]service/db
    url = urlparse(location)
    kwargs["db"] = int(url.path.strip("/") or 0)
    if url.password:
        kwargs.setdefault("password", unquote(url.password))
    if url.username:
        kwargs.setdefault("username", unquote(url.username))
    if url.scheme == "rediss":
        kwargs["ssl"] = True
    sentinel_kwargs = dict(options.get("SENTINEL_KWARGS") or {})
    sentinel_kwargs.update(
        socket_timeout=conf.TIMEOUT,
        socket_connect_timeout=conf.CONNECT_TIMEOUT,
        retry=AsyncRetry(NoBackoff(), 0),
    )
    manager = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        [tuple(s) for s in sentinels], sentinel_kwargs=sentinel_kwargs
    )
    return manager.master_for(url.hostname, redis_class=redis.asyncio.Redis, **kwargs)


class ServerClock:
    """A store's clock as this process estimates it, which only calendar windows need: their
    starts are computed here (in TIME_ZONE) around it, and decide.lua picks the window that
    holds its own TIME. Off by more than a window (the first call to a server whose clock
    differs that much), the script decides nothing and says its time; the estimate is
    corrected and the call sent once more."""

    __slots__ = ("offset",)

    def __init__(self) -> None:
        self.offset = 0.0  # the server's time minus this host's, in seconds

    def now(self) -> float:
        return time.time() + self.offset

    def missed(self, reply: Sequence[int]) -> bool:
        """Whether decide.lua found its time outside a calendar check's windows and decided
        nothing; if so, the estimate is corrected for the call to be sent again."""
        if reply[1] != CLOCK_MISS:
            return False
        self.offset = reply[0] / US - time.time()
        return True


class CalendarMissError(RedisError):
    """The store's clock moved out of the calendar windows sent to it, twice in a row."""

    def __init__(self) -> None:
        super().__init__(
            "the store's clock left the calendar windows sent to it (it was moved by more "
            "than a week or month during the call)"
        )


class RuleArgs(NamedTuple):
    """A rule's part of decide.lua's arguments (its header): those before a check's cost and
    after it (a calendar window's four starts follow, computed per call); the same framed in
    the Redis protocol; and how many there are in all."""

    head: tuple[str | int, ...]
    tail: tuple[int, ...]
    wire_head: bytes
    wire_tail: bytes
    n_args: int


def rule_args(rule: CompiledRule) -> RuleArgs:
    """The rule's RuleArgs, made once per compiled rule and kept on it (``store_args``): a
    request only joins them."""
    found: RuleArgs | None = rule.store_args
    if found is not None:
        return found
    code = ALGORITHM_CODES[rule.algorithm] if rule.calendar is None else CALENDAR_CODE
    # A shadow rule's limit goes negative.
    head = (code, rule.limit if rule.enforcing else -rule.limit, rule.period)
    tail: tuple[int, ...] = (rule.block,)
    if rule.algorithm in ALGORITHMS_WITH_BURST:
        tail += (rule.burst,)
    n_args = len(head) + 1 + len(tail) + (0 if rule.calendar is None else 4)
    made = RuleArgs(head, tail, bulk(*head), bulk(*tail), n_args)
    object.__setattr__(rule, "store_args", made)  # a cache: the rule is frozen otherwise
    return made


def decide_input(checks: Sequence[Check], dry_run: bool, clock: ServerClock) -> list[Any]:
    """The number of keys, KEYS and ARGV of decide.lua, as EVALSHA takes them."""
    keys, args = script_input(checks, dry_run, clock)
    return [len(keys), *keys, *args]


def script_input(
    checks: Sequence[Check], dry_run: bool, clock: ServerClock
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of decide.lua (see its header)."""
    keys = []
    args: list[Any] = ["dry"] if dry_run else []
    for check in checks:
        rule = check.rule
        key = rule.state_prefix + client_tag(check.identity)
        keys.append(key)
        keys.append(key + BLOCK_SUFFIX)  # any rule's client may be blocked (block.lua)
        own = rule.store_args or rule_args(rule)
        args += own.head
        args.append(check.cost)
        args += own.tail
        if rule.calendar is not None:
            args += rule.calendar.starts(clock.now())
    return keys, args


def packed_decide(checks: Sequence[Check], dry_run: bool, clock: ServerClock) -> bytes:
    """decide_input()'s EVALSHA as the bytes sent on the wire: each rule's arguments are
    framed once (rule_args), so a request joins a few byte strings instead of encoding and
    framing every argument."""
    keys = []
    args = [_DRY] if dry_run else []
    n_args = len(args)
    for check in checks:
        rule = check.rule
        key = (rule.state_prefix + client_tag(check.identity)).encode("utf-8", "surrogatepass")
        keys.append(b"$%d\r\n%s\r\n" % (len(key), key))
        keys.append(b"$%d\r\n%s%s\r\n" % (len(key) + _BLOCK_LEN, key, _BLOCK_SUFFIX))
        own = rule.store_args or rule_args(rule)
        args.append(own.wire_head)
        args.append(_COST_ONE if check.cost == 1 else bulk(check.cost))
        args.append(own.wire_tail)
        if rule.calendar is not None:
            args.append(bulk(*rule.calendar.starts(clock.now())))
        n_args += own.n_args
    head = array(3 + len(keys) + n_args) + _EVALSHA_DECIDE + _bulk_int(len(keys))
    return b"".join([head, *keys, *args])


def _bulk_int(value: int) -> bytes:
    return _SMALL[value] if value < len(_SMALL) else bulk(value)


def parse_reply(checks: Sequence[Check], reply: Sequence[int]) -> list[Result]:
    if reply[1] == CLOCK_MISS:
        raise CalendarMissError()
    at = reply[0]
    now = at / US
    results = []
    i = 2
    for check in checks:
        rule = check.rule
        state = reply[i]  # 1 allowed, 0 rejected, 2 rejected and blocked
        wait = reply[i + 3] / US  # allowed: the delay; rejected: the retry-after
        # Positional (the field order of Result): keywords cost twice the construction.
        results.append(
            Result(
                rule,
                check.identity,
                state == 1,  # allowed
                rule.limit,
                reply[i + 1],  # remaining
                now + reply[i + 2] / US,  # reset_at
                0.0 if state == 1 else wait,  # retry_after
                wait if state == 1 else 0.0,  # delay
                state == 2,  # blocked
                at,
                check.cost,
            )
        )
        i += REPLY_FIELDS
    return results


def block_input(checks: Sequence[Check], seconds: int) -> list[Any]:
    """The number of keys, KEYS and ARGV of block.lua (see its header)."""
    keys = [state_key(c.rule, c.identity) + BLOCK_SUFFIX for c in checks]
    return [len(keys), *keys, seconds * 1000]


def sha1(source: str) -> str:
    return hashlib.sha1(source.encode("utf-8")).hexdigest()


def refund_input(checks: Sequence[Check], at_us: int) -> list[Any]:
    """The number of keys, KEYS and ARGV of refund.lua (see its header)."""
    keys = [state_key(c.rule, c.identity) for c in checks]
    args: list[Any] = [at_us]
    moment = at_us / US if at_us else time.time()
    for check in checks:
        rule = check.rule
        calendar = rule.calendar
        if calendar is None:
            args += (ALGORITHM_CODES[rule.algorithm], rule.limit, rule.period, rule.burst)
        else:
            args += (CALENDAR_CODE, rule.limit, rule.period, calendar.encoded(moment))
        args.append(check.cost)
    return [len(keys), *keys, *args]


DECIDE_SOURCE = load_lua("decide.lua")
DECIDE_SHA = sha1(DECIDE_SOURCE)
_EVALSHA_DECIDE = bulk("EVALSHA", DECIDE_SHA)
_DRY, _COST_ONE = bulk("dry"), bulk(1)
_BLOCK_SUFFIX = BLOCK_SUFFIX.encode("ascii")
_BLOCK_LEN = len(_BLOCK_SUFFIX)
_SMALL = tuple(bulk(i) for i in range(32))
REFUND_SOURCE = load_lua("refund.lua")
REFUND_SHA = sha1(REFUND_SOURCE)
BLOCK_SOURCE = load_lua("block.lua")
BLOCK_SHA = sha1(BLOCK_SOURCE)
