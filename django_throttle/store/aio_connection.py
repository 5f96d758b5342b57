"""The async decision call's own connection: an ``asyncio.Protocol`` whose bytes go straight
to hiredis's ``Reader``, one command in flight, one future per reply.

redis.asyncio's connection reads through asyncio's ``StreamReader`` and ``StreamWriter``
(a drain, a read, a buffer check before every reuse) and bounds each read with a timeout
context: about twice redis-py's cost for one EVALSHA. Here a command is a future, the write
of its bytes and a deadline; the reply resolves the future from ``data_received``. What
stays redis-py's: the exception classes (error replies are mapped by its parser's
``parse_error``), the SSL context, the Sentinel pool that names the primary.

Which pools get it, and which keep redis.asyncio's connections: docs/internals.md,
"Connections"."""

from __future__ import annotations

import asyncio
import socket
import time
from asyncio import BaseEventLoop
from collections.abc import Callable
from functools import partial
from typing import Any

import redis.asyncio.cluster
from redis._parsers.base import BaseParser
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.asyncio.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection
from redis.exceptions import ConnectionError, InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .connections import AsyncConnectionStack, Command, LoopStack, acall, recovered
from .deadlines import connected, waiting, within
from .promotion import Address, Promotion, promoted_replica, replication_fields
from .steps import adrive

try:
    import hiredis

    HIREDIS = True
except ImportError:  # pragma: no cover - the test extra installs it
    HIREDIS = False

# The connection classes whose options are read here (a subclass may do anything on connect:
# it keeps redis.asyncio's own connection).
_PLAIN = (Connection, SSLConnection, UnixDomainSocketConnection)
_SENTINEL = (SentinelManagedConnection, SentinelManagedSSLConnection)

_NOT_ENOUGH = object()  # hiredis's answer while a reply is incomplete
# Error replies become redis-py's exceptions. redis-py 5.0 maps a cluster's redirections
# (MOVED, ASK, TRYAGAIN...) in its cluster parser only; later releases in the base parser.
_parse_error: Callable[[str], Exception] = getattr(
    redis.asyncio.cluster, "ClusterParser", BaseParser
).parse_error


class Options:
    """How to open a connection, read once from what redis.asyncio's would be made with."""

    __slots__ = (
        "client_name",
        "connect_timeout",
        "db",
        "encoding",
        "host",
        "keepalive",
        "password",
        "path",
        "port",
        "sentinel_pool",
        "ssl",
        "timeout",
        "username",
    )

    def __init__(self, conn: Any) -> None:
        self.host: str = getattr(conn, "host", "")
        self.port: int = int(getattr(conn, "port", 0) or 0)
        self.path: str = getattr(conn, "path", "")  # a unix socket
        self.ssl = conn.ssl_context.get() if isinstance(conn, SSLConnection) else None
        self.username: str | None = conn.username
        self.password: str | None = conn.password
        self.db = int(conn.db or 0)
        self.client_name: str | None = conn.client_name
        self.timeout: float | None = conn.socket_timeout
        self.connect_timeout: float | None = conn.socket_connect_timeout
        keepalive = getattr(conn, "socket_keepalive", False)  # TCP only
        self.keepalive: dict[int, Any] | None = (
            dict(conn.socket_keepalive_options or {}) if keepalive else None
        )
        encoder = conn.encoder
        self.encoding: tuple[str, str] | None = (
            (encoder.encoding, encoder.encoding_errors) if encoder.decode_responses else None
        )
        # A Sentinel-managed connection asks the Sentinels for the primary when it connects.
        self.sentinel_pool: Any = conn.connection_pool if isinstance(conn, _SENTINEL) else None

    @classmethod
    def for_pool(cls, pool: Any, **overrides: Any) -> Options | None:
        """The options of a pool's connections; None where the lean connection does not
        serve them: without hiredis, a connection class of one's own, a credential provider,
        a connect callback, or a Sentinel pool of replicas."""
        if not HIREDIS:
            return None
        connection_class = getattr(pool, "connection_class", None)
        if connection_class not in (*_PLAIN, *_SENTINEL):
            return None
        conn = connection_class(**{**pool.connection_kwargs, **overrides})
        if conn.credential_provider is not None or conn.redis_connect_func is not None:
            return None
        if isinstance(conn, _SENTINEL) and not conn.connection_pool.is_master:
            return None
        return cls(conn)

    def reader(self) -> Any:
        kwargs: dict[str, Any] = {
            "protocolError": InvalidResponse,
            "replyError": _parse_error,
            "notEnoughData": _NOT_ENOUGH,
        }
        if self.encoding is not None:
            kwargs["encoding"], kwargs["errors"] = self.encoding
        return hiredis.Reader(**kwargs)


class LeanConnection(asyncio.Protocol):
    """One connection: send() writes a command and returns the future of its reply.

    Each command is bounded as a whole by the socket timeout. Rather than a timer made and
    cancelled per command, one timer per connection: when it fires, a command past its
    deadline fails (and the connection is closed); one still within it re-arms the timer at
    its deadline. A connection that timed out, broke, read an unasked reply or was closed by
    the server is ``closed`` and never sent anything again."""

    __slots__ = (
        "address",
        "clock",
        "closed",
        "deadline",
        "loop",
        "name",
        "reader",
        "timeout",
        "timer",
        "transport",
        "waiter",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, options: Options, name: str) -> None:
        self.loop = loop
        # asyncio's own loops read time.monotonic() through a method; call it directly.
        self.clock = time.monotonic if type(loop).time is BaseEventLoop.time else loop.time
        self.reader = options.reader()
        self.timeout = options.timeout
        self.name = name  # host:port, for error messages
        self.address: tuple[str, int] | None = None  # the primary a Sentinel pool named
        self.transport: Any = None
        self.waiter: asyncio.Future[Any] | None = None
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False

    def send(self, packed: bytes) -> asyncio.Future[Any]:
        """Write one command (in the Redis protocol); the future of its reply."""
        if self.closed:
            raise ConnectionError(f"Connection to {self.name} is closed")
        waiter = self.loop.create_future()
        self.waiter = waiter
        self.transport.write(packed)
        if self.timeout is not None:
            self.deadline = deadline = self.clock() + self.timeout
            if self.timer is None:
                self.timer = self.loop.call_at(deadline, self._check_deadline)
        return waiter

    def close(self) -> None:
        """Close at once, a command in flight failing; its late reply can never be read."""
        self._fail(ConnectionError(f"Connection to {self.name} closed"))

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        waiter = self.waiter
        if waiter is None:  # nothing was asked: the connection no longer lines up
            self._fail(ConnectionError(f"Unexpected data from {self.name}"))
            return
        try:
            reply = reader.gets()
        except InvalidResponse as exc:
            self._fail(exc)
            return
        if reply is _NOT_ENOUGH:
            return
        self.waiter = None
        if reader.has_data():
            self._fail(ConnectionError(f"More replies than commands from {self.name}"))
        if waiter.done():  # cancelled: its caller closes the connection
            return
        # An error reply: raised as redis-py raises it (LOADING is a ConnectionError).
        if isinstance(reply, (ResponseError, ConnectionError)):
            waiter.set_exception(reply)
        else:
            waiter.set_result(reply)

    def eof_received(self) -> bool:
        self._fail(ConnectionError(f"Connection closed by {self.name}"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        error = ConnectionError(f"Error while reading from {self.name}: {exc or 'closed'}")
        self._fail(error)

    # -- failures -------------------------------------------------------------------------

    def _check_deadline(self) -> None:
        timer, self.timer = self.timer, None
        if self.waiter is None or self.timeout is None:
            return  # idle: the next command arms the timer again
        if timer is not None and self.deadline > timer.when():
            self.timer = self.loop.call_at(self.deadline, self._check_deadline)
            return
        if waiting(self.transport.get_extra_info("socket")):
            # The reply is there and the loop was busy: it reads it on its next turn, before
            # this timer (call_at(now) runs after that turn's I/O) looks again.
            self.timer = self.loop.call_at(self.loop.time(), self._check_deadline)
            return
        self._fail(RedisTimeoutError(f"Timeout reading from {self.name}"))

    def _fail(self, error: Exception) -> None:
        self.closed = True
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.abort()


def pack(args: tuple[Any, ...]) -> bytes:
    """A command's arguments in the Redis protocol (bytes as they are; str in UTF-8)."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            data = arg.encode("utf-8", "surrogatepass")
        elif isinstance(arg, (bytes, bytearray, memoryview)):
            data = bytes(arg)
        else:
            data = repr(arg).encode() if isinstance(arg, float) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


async def connect(options: Options, address: Address | None = None) -> LeanConnection:
    """A new connection, through AUTH, SELECT and CLIENT SETNAME (or a PING): no command is
    sent on it before the server has answered one. To ``address`` if given, else to the
    primary the Sentinels name, for a Sentinel pool. The connect (TCP, then TLS) is bounded by
    the connect timeout, each handshake command by the socket timeout, timed by the server's
    answer (store/deadlines.py)."""
    loop = asyncio.get_running_loop()
    host, port = options.host, options.port
    if address is not None:
        host, port = address
    elif options.sentinel_pool is not None:
        host, port = await options.sentinel_pool.get_master_address()
    name = options.path or f"{host}:{port}"
    conn = LeanConnection(loop, options, name)
    if options.sentinel_pool is not None:
        conn.address = (host, port)
    try:
        await _open(loop, options, conn, host, port, name)
    except OSError as exc:
        raise ConnectionError(f"Error connecting to {name}: {exc}") from exc
    try:
        if options.keepalive is not None:
            sock = conn.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in options.keepalive.items():
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
        for command in handshake(options):
            await conn.send(pack(command))
    except BaseException:
        conn.close()
        raise
    return conn


async def _open(
    loop: asyncio.AbstractEventLoop,
    options: Options,
    conn: LeanConnection,
    host: str,
    port: int,
    name: str,
) -> None:
    """Connect ``conn``'s socket. The connect timeout bounds what the server does (accept the
    TCP connection, answer the TLS handshake), not what the loop does between: a socket
    already connected, or with bytes waiting, is the loop's to finish."""
    if options.path:
        addresses: list[tuple[int, Any]] = [(socket.AF_UNIX, options.path)]
    else:
        found = await within(
            options.connect_timeout,
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM),
            lambda: False,
            lambda: RedisTimeoutError(f"Timeout resolving {name}"),
            stretch=True,
        )
        addresses = [(info[0], info[4]) for info in found]
    error: OSError | None = None
    for family, address in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await within(
                options.connect_timeout,
                loop.sock_connect(sock, address),
                partial(connected, sock),
                lambda: RedisTimeoutError(f"Timeout connecting to {name}"),
            )
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        break
    else:
        raise error or OSError(f"no address for {name}")
    try:
        if options.ssl is None:  # the loop's work only: no deadline
            if family == socket.AF_UNIX:
                await loop.create_unix_connection(lambda: conn, sock=sock)
            else:
                await loop.create_connection(lambda: conn, sock=sock)
        else:
            tls = (
                loop.create_unix_connection(lambda: conn, sock=sock, ssl=options.ssl)
                if family == socket.AF_UNIX
                else loop.create_connection(
                    lambda: conn, sock=sock, ssl=options.ssl, server_hostname=host
                )
            )
            await within(
                options.connect_timeout,
                tls,
                partial(waiting, sock),
                lambda: RedisTimeoutError(f"Timeout connecting to {name}"),
                stretch=True,  # the loop's own turns between the handshake's messages
            )
    except BaseException:
        sock.close()
        raise


def handshake(options: Options) -> list[tuple[Any, ...]]:
    """What a new connection says first, as redis-py's does (RESP2: the decision's replies are
    integers and arrays in either protocol; no CLIENT SETINFO, which only labels a client)."""
    commands: list[tuple[Any, ...]] = []
    if options.password is not None or options.username is not None:
        if options.username:
            commands.append(("AUTH", options.username, options.password or ""))
        else:
            commands.append(("AUTH", options.password or ""))
    if options.client_name:
        commands.append(("CLIENT", "SETNAME", options.client_name))
    if options.db:
        commands.append(("SELECT", options.db))
    # A TCP connect is made by the kernel even while the server is stopped (SIGSTOP): a command
    # sent now would run whenever it resumes. The breaker's probe sends its decision only
    # once the server has answered.
    return commands or [("PING",)]


class LeanConnectionStack(LoopStack):
    """LoopStack over lean connections."""

    def __init__(self, pool: Any, options: Options) -> None:
        super().__init__()
        self.pool = pool
        self.options = options
        # For a Sentinel pool: the primary the process's rules refresh last heard of from the
        # Sentinels (follow_primary()); a connection to another is not used again.
        self.primary: Callable[[], Any] | None = None
        self._promotion = Promotion()

    def _named(self) -> Any:
        """The primary the Sentinels name, as last heard of (None before any)."""
        if self.primary is not None:
            return self.primary()
        pool = self.options.sentinel_pool
        return None if pool is None else pool.master_address

    async def _connect(self) -> LeanConnection:
        # A promoted replica the Sentinels do not name yet, else the primary they name.
        return await connect(self.options, self._promotion.instead_of(self._named()))

    async def _usable(self, conn: LeanConnection) -> bool:
        # Not one the loop saw the server close while idle, nor one to an earlier primary.
        if conn.closed:
            return False
        return conn.address is None or self._follows(conn)

    def _follows(self, conn: LeanConnection) -> bool:
        """Whether a connection reaches the primary last heard of (any, if none yet)."""
        primary = self._promotion.primary(self._named())
        if primary is None or conn.address == tuple(primary):
            return True
        conn.close()
        return False

    async def promoted(self, conn: LeanConnection) -> bool:
        """ConnectionStack.promoted() on the loop."""
        pool = self.options.sentinel_pool
        if pool is None:
            return False

        async def replication(address: Address) -> dict[str, str]:
            probe = await connect(self.options, address)
            try:
                return replication_fields(await probe.send(pack(("INFO", "replication"))))
            finally:
                probe.close()

        found = await adrive(promoted_replica(pool, conn.address, replication))
        if found is None or conn.address is None:
            return False
        self._promotion.found(conn.address, found)
        return True

    async def _close(self, conn: LeanConnection) -> None:
        conn.close()

    def _drop(self, conn: LeanConnection) -> None:
        conn.close()

    def send(self, conn: LeanConnection, command: Command) -> asyncio.Future[Any]:
        return conn.send(command if isinstance(command, bytes) else pack(command))

    async def execute(self, *args: Any) -> Any:
        """Send one command and return its reply."""
        conn = await self.take()
        try:
            reply = await conn.send(pack(args))
        except ResponseError as exc:
            await self.settle(conn, exc)
            raise
        except BaseException as exc:
            await self.lost(conn, exc)
            raise
        self.give(conn)
        return reply

    async def run_packed(self, command: Command, source: str, again: bool = True) -> Any:
        idle = self._idle
        conn = idle.pop() if idle else None
        if conn is None or conn.closed or (conn.address is not None and not self._follows(conn)):
            conn = await self.take()
        try:
            reply = await conn.send(command if isinstance(command, bytes) else pack(command))
        except BaseException as exc:
            return await adrive(recovered(self, conn, command, source, exc, again))
        if self._waiters:
            self.give(conn)
        else:
            self._idle.append(conn)  # not ``idle``: disconnect() may have replaced it meanwhile
        return reply


AsyncStack = AsyncConnectionStack | LeanConnectionStack


async def acall_any(conn: Any, command: Command) -> Any:
    """One command on a connection of either stack (a cluster's redirection takes one)."""
    if isinstance(conn, LeanConnection):
        return await conn.send(command if isinstance(command, bytes) else pack(command))
    return await acall(conn, command)


def async_stack(pool: Any, *, one_deadline: bool = False, **overrides: Any) -> AsyncStack:
    """Lean connections where the pool's options allow them (Options.for_pool), else
    redis.asyncio's, on AsyncConnectionStack."""
    options = Options.for_pool(pool, **overrides)
    if options is not None:
        return LeanConnectionStack(pool, options)
    return AsyncConnectionStack(pool, one_deadline=one_deadline, **overrides)
