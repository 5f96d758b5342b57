"""The Redis backend: every check of a request in one EVALSHA of decide.lua."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import struct
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
from .aio_connection import LeanConnectionStack, async_stack
from .base import (
    BlockReads,
    Check,
    Result,
    block_key,
    client_keys,
    level_key,
    levels,
    state_key,
)
from .connections import Command, ConnectionStack, reloaded
from .errors import STORE_ERRORS
from .server_timed import server_timed
from .steps import adrive, drive
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
        self.blocks = BlockReads()  # the guarded store's own, once adopted

    @classmethod
    def from_cache(cls, alias: str) -> RedisStore:
        client, owned = client_from_cache(alias)
        return cls(client, owns_pool=owned)

    def close(self) -> None:
        """Close the store's own connections (never those of django-redis's pool)."""
        if self._stack is not None:
            self._stack.close()
        if self.owns_pool:
            pool = self.client.connection_pool
            pool.disconnect()
            # A Sentinel pool made here asks Sentinels of its own (client_from_cache()).
            manager = getattr(pool, "sentinel_manager", None)
            for sentinel in getattr(manager, "sentinels", ()):
                sentinel.close()

    def _run_on_client(self, sha: str, source: str, *args: Any) -> Any:
        command = ("EVALSHA", sha, *args)
        try:
            return self.client.execute_command(*command)
        except NoScriptError:
            return drive(reloaded(self._execute, command, source))

    def _execute(self, command: Command) -> Any:
        assert isinstance(command, tuple)  # the client's commands are never framed here
        return self.client.execute_command(*command)

    def decide(self, checks: Sequence[Check], dry_run: bool = False) -> list[Result]:
        if not checks:
            return []
        reply = self._decide(checks, dry_run)
        if reply[1] == CLOCK_MISS and self.clock.missed(reply):  # tested here: rare, a call costs
            reply = self._decide(checks, dry_run)
        return parse_reply(checks, reply)

    def _decide(self, checks: Sequence[Check], dry_run: bool) -> tuple[float, ...]:
        # EVALSHA straight away (redis-py's Script wrapper costs more per call than our
        # whole Python side); the script is loaded on NOSCRIPT, after SCRIPT FLUSH, a
        # restart or a failover, on the connection that reported it.
        every = self.blocks.every
        if self._stack is not None:
            return unpacked(
                self._stack.run_packed(
                    packed_decide(checks, dry_run, self.clock, every), DECIDE_SOURCE
                )
            )
        args = decide_input(checks, dry_run, self.clock, every)
        return unpacked(self._run_on_client(DECIDE_SHA, DECIDE_SOURCE, *args))

    def reset(self, rule: CompiledRule, identity: str) -> None:
        self.client.delete(*client_keys(rule, identity, self.clock.now()))

    def refund(self, checks: Sequence[Check], at: int = 0) -> None:
        if checks:
            self._run(REFUND_SHA, REFUND_SOURCE, *refund_input(checks, at))

    def block_levels(self, checks: Sequence[Check]) -> list[int]:
        return levels(self.client.mget([level_key(c.rule, c.identity) for c in checks]))

    def block(self, checks: Sequence[Check], seconds: int) -> None:
        if checks:
            self.blocks.every = True  # before: a decision after it reads the block
            self._run(BLOCK_SHA, BLOCK_SOURCE, *block_input(checks, seconds))


class AsyncRedisStore:
    """The same decisions through redis.asyncio, so an ASGI event loop never blocks on Redis."""

    def __init__(self, client: Any) -> None:
        self.client = client
        pool = getattr(client, "connection_pool", None)
        stackable = type(pool) in ASYNC_STACKABLE_POOLS
        self._stack = async_stack(pool, one_deadline=True) if stackable else None
        self.clock = ServerClock()
        self.blocks = BlockReads()

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
            packed = packed_decide(checks, dry_run, self.clock, self.blocks.every)
            reply = unpacked(await stack.run_packed(packed, DECIDE_SOURCE))
        else:
            reply = await self._decide(checks, dry_run)
        if reply[1] == CLOCK_MISS and self.clock.missed(reply):
            reply = await self._decide(checks, dry_run)
        return parse_reply(checks, reply)

    async def _decide(self, checks: Sequence[Check], dry_run: bool) -> tuple[float, ...]:
        every = self.blocks.every
        if self._stack is not None:
            return unpacked(
                await self._stack.run_packed(
                    packed_decide(checks, dry_run, self.clock, every), DECIDE_SOURCE
                )
            )
        return unpacked(
            await self._run(
                DECIDE_SHA, DECIDE_SOURCE, decide_input(checks, dry_run, self.clock, every)
            )
        )

    async def refund(self, checks: Sequence[Check], at: int = 0) -> None:
        if checks:
            await self._run(REFUND_SHA, REFUND_SOURCE, refund_input(checks, at))

    async def _run(self, sha: str, source: str, args: list[Any]) -> Any:
        if self._stack is not None:
            return await self._stack.run_script(sha, source, *args)
        command = ("EVALSHA", sha, *args)
        try:
            return await self.client.execute_command(*command)
        except NoScriptError:
            return await adrive(reloaded(self._execute, command, source))

    def _execute(self, command: Command) -> Any:
        assert isinstance(command, tuple)  # the client's commands are never framed here
        return self.client.execute_command(*command)

    async def reset(self, rule: CompiledRule, identity: str) -> None:
        await self.client.delete(*client_keys(rule, identity, self.clock.now()))


def decision_kwargs() -> dict[str, Any]:
    """Connection options every decision client gets, whatever the cache's.

    A throttling call must not inherit a cache's timeouts (often seconds, or none)
    or redis-py's retries with backoff: a hung server would stall every request.
    """
    return {
        "socket_timeout": conf.TIMEOUT,
        "socket_connect_timeout": conf.CONNECT_TIMEOUT,
        "retry": no_retry(),
        "decode_responses": False,  # decide.lua's reply is binary
    }


def _with_decision_timeouts(connection_kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(connection_kwargs)
    kwargs.pop("retry_on_timeout", None)
    kwargs.pop("connection_pool", None)  # Sentinel's back reference to its own pool
    kwargs.update(decision_kwargs())
    return kwargs


def untyped(function: object) -> Any:
    """A redis-py callable called without its signature's types."""
    # redis-py annotates more of itself release by release (8.2 types Sentinel, Retry and
    # NoBackoff; 5.0.1 none of them); called through Any, mypy --strict passes on 5.0.1 and
    # on the newest alike, where a `type: ignore` would be needed on one and "unused" on the
    # other.
    return function


def no_retry() -> Any:
    """redis-py's sync Retry of no retries: a decision is tried once."""
    return untyped(Retry)(untyped(NoBackoff)(), 0)


def no_async_retry() -> Any:
    """The same for redis.asyncio."""
    return untyped(AsyncRetry)(untyped(NoBackoff)(), 0)


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
        manager = untyped(Sentinel)(
            [(a["host"], a["port"]) for a in addresses],
            min_other_sentinels=old.min_other_sentinels,
            sentinel_kwargs=_with_decision_timeouts(old.sentinel_kwargs),
        )
        new_pool = untyped(SentinelConnectionPool)(
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


def ask_sentinels(client: Any) -> None:
    """For a client of a Sentinel pool, ask the Sentinels which server is the primary now.

    Called once per rules refresh: after a failover every process decides on the new primary
    within RULES_REFRESH (its connections to the old one are not used again), rather than
    when the old primary is demoted, up to 10 s later, counting meanwhile on both."""
    pool: Any = getattr(client, "connection_pool", None)
    if type(pool) is not SentinelConnectionPool or not pool.is_master:
        return
    # No Sentinel answers: the primary known stays in use, as for a decision.
    with contextlib.suppress(*STORE_ERRORS):
        untyped(pool.get_master_address)()


def follow_primary(async_store: Any, sync_store: Any) -> None:
    """Have a loop's store of a Sentinel pool follow the primary that the sync store's pool,
    asked by every rules refresh (ask_sentinels()), knows: after a failover the loop's
    decisions move to the new primary within RULES_REFRESH too."""
    stack = getattr(async_store, "_stack", None)
    pool: Any = getattr(getattr(sync_store, "client", None), "connection_pool", None)
    if not isinstance(stack, LeanConnectionStack) or stack.options.sentinel_pool is None:
        return
    if type(pool) is SentinelConnectionPool and pool.is_master:
        stack.primary = lambda: pool.master_address


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
    kwargs.update(decision_kwargs(), retry=no_async_retry())
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
        retry=no_async_retry(),
    )
    manager = untyped(redis.asyncio.sentinel.Sentinel)(
        [tuple(s) for s in sentinels], sentinel_kwargs=sentinel_kwargs
    )
    # Asking them for the primary (each new connection does) is timed by their answers, not
    # by the loop's turns: a busy loop fails no connect (and opens no breaker).
    for sentinel in manager.sentinels:
        pool = sentinel.connection_pool
        pool.connection_class = server_timed(pool.connection_class)
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

    def missed(self, reply: Sequence[float]) -> bool:
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


# decide.lua's number for each algorithm (a check's spec: period * 64 + flags, see its header).
SCRIPT_ALGORITHMS = {"f": 1, CALENDAR_CODE: 2, "c": 3, "l": 4, "t": 5, "b": 6, "n": 7}
_BLOCK_SECONDS_FOLLOW, _COST_FOLLOWS, _BLOCK_KEY_FOLLOWS = 8, 16, 32


class RuleArgs(NamedTuple):
    """A rule's part of decide.lua's arguments: its spec and limit, for each of the four ways a
    check sends them (``heads[cost_follows + 2 * block_key_follows]``), then what follows a
    check's cost (its block duration if it has one, a bucket's burst; a calendar window's four
    starts follow those, computed per call); the same framed in the Redis protocol; how many
    arguments the rule sends besides a cost. Then its state key and its block key, each framed up
    to the client's tag (whose length is fixed: ``$<length>\r\n<prefix>``)."""

    heads: tuple[tuple[int, int], ...]
    tail: tuple[int | str, ...]
    wire_heads: tuple[bytes, ...]
    wire_tail: bytes
    n_args: int
    wire_key: bytes
    wire_block: bytes


def rule_args(rule: CompiledRule) -> RuleArgs:
    """The rule's RuleArgs, made once per compiled rule and kept on it (``store_args``): a
    request only joins them."""
    found: RuleArgs | None = rule.store_args
    if found is not None:
        return found
    code = ALGORITHM_CODES[rule.algorithm] if rule.calendar is None else CALENDAR_CODE
    spec = rule.period * 64 + SCRIPT_ALGORITHMS[code]
    tail: tuple[int | str, ...] = ()
    if rule.block and not rule.defers_block:  # a deferring rule reads its block, never starts it
        spec += _BLOCK_SECONDS_FOLLOW
        growing = rule.block_growth > 1
        tail += (
            f"{rule.block}g{rule.block_growth}m{conf.BLOCK_MEMORY}" if growing else rule.block,
        )
    if rule.algorithm in ALGORITHMS_WITH_BURST:
        tail += (rule.burst,)
    limit = rule.limit if rule.enforcing else -rule.limit  # a shadow rule's goes negative
    heads = tuple(
        (spec + (_COST_FOLLOWS if n % 2 else 0) + (_BLOCK_KEY_FOLLOWS if n >= 2 else 0), limit)
        for n in range(4)
    )
    n_args = 2 + len(tail) + (0 if rule.calendar is None else 4)
    prefix = rule.state_prefix.encode("utf-8", "surrogatepass")
    wire_key = b"$%d\r\n%s" % (len(prefix) + TAG_LENGTH, prefix)
    block = rule.block_prefix.encode("utf-8", "surrogatepass")
    wire_block = b"$%d\r\n%s" % (len(block) + TAG_LENGTH + _BLOCK_LEN, block)
    wire_heads = tuple(bulk(*h) for h in heads)
    made = RuleArgs(heads, tail, wire_heads, bulk(*tail), n_args, wire_key, wire_block)
    object.__setattr__(rule, "store_args", made)  # a cache: the rule is frozen otherwise
    return made


def decide_input(
    checks: Sequence[Check], dry_run: bool, clock: ServerClock, every_block: bool = True
) -> list[Any]:
    """The number of keys, KEYS and ARGV of decide.lua, as EVALSHA takes them."""
    keys, args = script_input(checks, dry_run, clock, every_block)
    return [len(keys), *keys, *args]


def script_input(
    checks: Sequence[Check], dry_run: bool, clock: ServerClock, every_block: bool = True
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of decide.lua (see its header). A check's block key is sent if its rule
    starts blocks or ``every_block`` (BlockReads); its cost only if it is not 1."""
    keys = []
    args: list[Any] = ["dry"] if dry_run else []
    for check in checks:
        rule = check.rule
        key = rule.state_prefix + client_tag(check.identity)
        keys.append(key)
        reads_block = every_block or rule.block > 0
        if reads_block:
            keys.append(block_key(rule, check.identity))
        own = rule.store_args or rule_args(rule)
        cost = check.cost
        args += own.heads[(cost != 1) + 2 * reads_block]
        if cost != 1:
            args.append(cost)
        args += own.tail
        if rule.calendar is not None:
            args += rule.calendar.starts(clock.now())
    return keys, args


def packed_decide(
    checks: Sequence[Check], dry_run: bool, clock: ServerClock, every_block: bool = True
) -> bytes:
    """decide_input()'s EVALSHA as the bytes sent on the wire: each rule's arguments are
    framed once (rule_args), so a request joins a few byte strings instead of encoding and
    framing every argument."""
    keys = []
    args = [_DRY] if dry_run else []
    n_args = len(args)
    for check in checks:
        rule = check.rule
        own = rule.store_args or rule_args(rule)
        tag = wire_tag(check.identity)
        keys.append(own.wire_key + tag + _CRLF)
        way = 0
        if every_block or rule.block:
            keys.append(own.wire_block + tag + _BLOCK_END)
            way = 2
        cost = check.cost
        if cost == 1:
            args.append(own.wire_heads[way])
        else:
            args.append(own.wire_heads[way + 1])
            args.append(bulk(cost))
            n_args += 1
        args.append(own.wire_tail)
        if rule.calendar is not None:
            args.append(bulk(*rule.calendar.starts(clock.now())))
        n_args += own.n_args
    head = _HEADS.get((len(keys), n_args))
    if head is None:
        head = array(3 + len(keys) + n_args) + _EVALSHA_DECIDE + _bulk_int(len(keys))
        if len(_HEADS) < MAX_HEADS:
            _HEADS[len(keys), n_args] = head
    return b"".join([head, *keys, *args])


@functools.lru_cache(maxsize=16_384)  # as client_tag(): a client's tag once, not per request
def wire_tag(identity: str) -> bytes:
    """client_tag() in bytes (ASCII: braces around base64)."""
    return client_tag(identity).encode("ascii")


def _bulk_int(value: int) -> bytes:
    return _SMALL[value] if value < len(_SMALL) else bulk(value)


# The head of a decision's EVALSHA (its length, the script, the number of keys) by the number
# of keys and of arguments: a site's requests meet a few combinations of rules.
_HEADS: dict[tuple[int, int], bytes] = {}
MAX_HEADS = 256


def unpacked(reply: bytes) -> tuple[float, ...]:
    """decide.lua's reply, little-endian doubles (struct.pack: for Redis, a table reply costs
    more than a check's own commands), as the numbers they are."""
    unpack = _UNPACK.get(len(reply))
    if unpack is None:
        unpack = _UNPACK[len(reply)] = struct.Struct(f"<{len(reply) // 8}d").unpack
    return unpack(reply)


def parse_reply(checks: Sequence[Check], reply: Sequence[float]) -> list[Result]:
    if reply[1] == CLOCK_MISS:
        raise CalendarMissError()
    at = int(reply[0])
    now = at / US
    results = []
    i = 2
    for check in checks:
        rule = check.rule
        state = reply[i]  # 1 allowed, 0 rejected, 2 rejected and blocked
        wait = reply[i + 3] / US  # allowed: the delay; rejected: the retry-after
        remaining = int(reply[i + 1])  # negative: a log-only window's count past its limit
        # Positional (the field order of Result): keywords cost twice the construction.
        results.append(
            Result(
                rule,
                check.identity,
                state == 1,  # allowed
                rule.limit,
                remaining if remaining >= 0 else 0,
                now + reply[i + 2] / US,  # reset_at
                0.0 if state == 1 else wait,  # retry_after
                wait if state == 1 else 0.0,  # delay
                state == 2,  # blocked
                at,
                check.cost,
                False,  # local
                0 if remaining >= 0 else -remaining,  # past
            )
        )
        i += REPLY_FIELDS
    return results


def block_input(checks: Sequence[Check], seconds: int) -> list[Any]:
    """The number of keys, KEYS and ARGV of block.lua (see its header)."""
    keys = [block_key(c.rule, c.identity) for c in checks]
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
            # A bucket's slot carries the arrival time its decision left (refund.lua).
            extra = check.until if rule.algorithm in ALGORITHMS_WITH_BURST else rule.burst
            args += (ALGORITHM_CODES[rule.algorithm], rule.limit, rule.period, extra)
        else:
            args += (CALENDAR_CODE, rule.limit, rule.period, calendar.encoded(moment))
        args.append(check.cost)
    return [len(keys), *keys, *args]


DECIDE_SOURCE = load_lua("decide.lua")
DECIDE_SHA = sha1(DECIDE_SOURCE)
_EVALSHA_DECIDE = bulk("EVALSHA", DECIDE_SHA)
_DRY, _CRLF = bulk("dry"), b"\r\n"
TAG_LENGTH = len(client_tag(""))  # every tag has this length
_BLOCK_LEN = len(BLOCK_SUFFIX)
_BLOCK_END = BLOCK_SUFFIX.encode("ascii") + _CRLF
_SMALL = tuple(bulk(i) for i in range(32))
# Reply lengths in bytes: the calendar miss (two numbers) and 1 to 16 checks; others on demand.
_UNPACK = {8 * n: struct.Struct(f"<{n}d").unpack for n in (2, *(2 + 4 * k for k in range(1, 17)))}
REFUND_SOURCE = load_lua("refund.lua")
REFUND_SHA = sha1(REFUND_SOURCE)
BLOCK_SOURCE = load_lua("block.lua")
BLOCK_SHA = sha1(BLOCK_SOURCE)
HOLD_SOURCE = load_lua("hold.lua")
