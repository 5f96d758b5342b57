"""Connections for the decision call: one command, one reply, nothing else on the way.

Why not redis-py's ``execute_command``, and when a connection is dropped: docs/internals.md,
"Connections"."""

from __future__ import annotations

import asyncio
import os
import re
import select
import socket
import struct
import sys
import weakref
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from redis import ConnectionPool
from redis._parsers import hiredis as hiredis_parser
from redis.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import (
    ClusterDownError,
    ConnectionError,
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.sentinel import SentinelConnectionPool

from .deadlines import answered_on, within
from .promotion import Address, Promotion, promoted_replica, replication_fields
from .steps import Steps, adrive, drive

_stacks: weakref.WeakSet[ConnectionStack] = weakref.WeakSet()

# A command: its arguments, or all of it already in the Redis protocol.
Command = tuple[Any, ...] | bytes

# Error replies after which a connection's server is no longer the writable primary
# (MASTERDOWN and CLUSTERDOWN are ClusterDownError; LOADING is a ConnectionError).
SERVER_GONE_REPLIES = (ReadOnlyError, ClusterDownError)

# Pools whose connections the stack can make itself: the plain pool and Sentinel's, whose
# connections ask the Sentinels for the primary's address when they connect.
STACKABLE_POOLS = (ConnectionPool, SentinelConnectionPool)


# Connections whose replies the stack may read through hiredis's reader itself
# (reads_directly): the plain ones, not Sentinel's (which turns READONLY into a
# ConnectionError) nor TLS ones (whose socket buffers decrypted bytes of its own).
DIRECT_CONNECTIONS = (Connection, UnixDomainSocketConnection)
# What hiredis's reader returns while a reply is incomplete (redis-py 5.0: False).
_NOT_ENOUGH_DATA = getattr(hiredis_parser, "NOT_ENOUGH_DATA", False)
_SERVER_CLOSED = "Connection closed by server."  # redis-py's words
# Python bounds a socket's calls by its timeout with a poll() before each send and receive: two
# syscalls more per decision. On Linux the kernel bounds them instead (SO_SNDTIMEO and
# SO_RCVTIMEO on a blocking socket), and a call past its time fails with EAGAIN.
KERNEL_TIMEOUTS = sys.platform.startswith("linux")


# Redis 6.2 wraps an error inside a script ("ERR Error running script ... -READONLY ..."),
# and redis-py 5 does not map MASTERDOWN outside a cluster: the code is read in the text.
# NOREPLICAS: a primary fenced by min-replicas-to-write (store/promotion.py).
_GONE_CODES = re.compile(r"(?:^|-)(READONLY|MASTERDOWN|NOREPLICAS)\b")


def keeps(error: ResponseError) -> bool:
    """Whether a connection that read this error reply whole may be used again."""
    return not isinstance(error, SERVER_GONE_REPLIES) and not _GONE_CODES.search(str(error))


def demoted(error: BaseException) -> bool:
    """Whether the server said it is a replica now (redis-py's Sentinel connections turn
    READONLY into a ConnectionError raised while handling it).

    A script refused with READONLY wrote nothing (decide.lua writes only once every check
    is evaluated), so the decision can be sent again, once, on a new connection: through
    the configured address or the Sentinels, it reaches the new primary. A cancellation or
    an interrupt is never retried."""
    if not isinstance(error, Exception):
        return False
    for candidate in (error, error.__context__):
        if isinstance(candidate, ReadOnlyError) or _code(candidate) == "READONLY":
            return True
    return False


def fenced(error: BaseException) -> bool:
    """Whether a primary refused the script's first write because fewer replicas than its
    ``min-replicas-to-write`` follow it (NOREPLICAS): nothing was written, and if a failover
    just promoted its replica (store/promotion.py), the decision can be sent there once."""
    return _code(error) == "NOREPLICAS"


def _code(error: BaseException | None) -> str | None:
    if not isinstance(error, ResponseError):
        return None
    match = _GONE_CODES.search(str(error))
    return None if match is None else match.group(1)


class ConnectionStack:
    """Idle connections, most recently used first, made as the pool's own would be.

    As many connections exist as decisions ever ran at once in this process (a
    thread holds one for a single command), like redis-py's pool. list.pop and
    list.append are atomic, so no lock is taken.
    """

    def __init__(self, pool: Any, *, direct_reads: bool = True, **overrides: Any) -> None:
        self.pool = pool  # Sentinel's connections hold a weak proxy to it
        self._connection_class = pool.connection_class
        self._kwargs = {**pool.connection_kwargs, **overrides}
        self._idle: list[Any] = []
        # Whether replies are read through hiredis's reader directly (where the connections
        # allow it, and every command goes through execute() and run_packed(): not a caller's
        # own of taken connections), known once the first connection is made.
        self._direct_reads = direct_reads
        self.direct = False
        # A Sentinel pool of the primary: each connection remembers the primary it reached,
        # and one made before the pool learnt of a new primary is not used again.
        self._sentinel = isinstance(pool, SentinelConnectionPool) and pool.is_master
        self._promotion = Promotion()
        _stacks.add(self)

    @classmethod
    def for_pool(cls, pool: Any) -> ConnectionStack | None:
        """A stack for a plain or Sentinel pool; None for other custom or client-side-caching
        pools, or a client without a pool: those keep redis-py's own path."""
        if type(pool) not in STACKABLE_POOLS or getattr(pool, "cache", None) is not None:
            return None
        return cls(pool)

    def take(self) -> Any:
        """An idle connection, or a new one, connected.

        connect() is called here, as redis-py's pool does: Sentinel's connections ask
        the Sentinels for the primary's address there (sending a command would connect
        to the configured host, the service name)."""
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._connection_class(**self._kwargs)
            self.direct = self._direct_reads and reads_directly(conn)
        else:
            # Every idle connection finished its last command. One that reads as ready
            # before we sent anything was closed by the server (restart, idle timeout):
            # reconnect, as redis-py's pool does, instead of failing this request on it.
            if self._sentinel and getattr(conn, _PRIMARY, None) != self.primary():
                pass  # to a primary of before a failover: counts must go to one server
            elif self.direct:
                if not _readable(conn):
                    return conn
            else:
                try:
                    if not conn.can_read():
                        return conn
                except ConnectionError:
                    pass
            conn.disconnect()
        if self._sentinel:
            primary = self._promotion.instead_of(self.pool.master_address)
            if primary is not None:  # a promoted replica the Sentinels do not name yet
                conn.connect_to(primary)
            else:
                conn.connect()  # asks the Sentinels
                primary = self.pool.master_address
            setattr(conn, _PRIMARY, primary)
        else:
            conn.connect()
        if self.direct:
            kernel_timeouts(conn)
        return conn

    def give(self, conn: Any) -> None:
        self._idle.append(conn)

    def primary(self) -> Any:
        """A Sentinel pool's primary for decisions: the one the Sentinels name, or the replica
        found promoted (promoted()) while they still name the old one."""
        return self._promotion.primary(self.pool.master_address)

    def promoted(self, conn: Any) -> bool:
        """After ``conn``'s primary refused a write with NOREPLICAS: whether another server is
        the primary now (store/promotion.py), where the next connections go."""
        if not self._sentinel:
            return False
        kwargs = {k: v for k, v in self._kwargs.items() if k != "connection_pool"}
        plain = SSLConnection if issubclass(self._connection_class, SSLConnection) else Connection

        def replication(address: Address) -> dict[str, str]:
            probe: Any = plain(**{**kwargs, "host": address[0], "port": address[1]})
            try:
                probe.send_command("INFO", "replication")
                return replication_fields(probe.read_response())
            finally:
                probe.disconnect()

        fenced = getattr(conn, _PRIMARY, None)
        found = drive(promoted_replica(self.pool, fenced, replication))
        if found is None or fenced is None:
            return False
        self._promotion.found(fenced, found)
        return True

    def execute(self, *args: Any) -> Any:
        """Send one command and return its reply; Redis errors are raised as redis-py raises them."""
        conn = self.take()
        try:
            reply = direct_call(conn, as_bytes(conn, args)) if self.direct else call(conn, args)
        except ResponseError as exc:
            self.settle(conn, exc)
            raise
        except BaseException as exc:
            self.lost(conn, exc)  # timed out or broken halfway: never reused
            raise
        self._idle.append(conn)
        return reply

    def run_script(self, sha: str, source: str, *args: Any) -> Any:
        """EVALSHA, the script run from its source on this same connection if its server lacks
        it; once more on a new connection if the server has become a replica (recovered())."""
        return self.run_packed(("EVALSHA", sha, *args), source)

    def run_packed(self, command: Command, source: str, again: bool = True) -> Any:
        """run_script() of an EVALSHA whose arguments are given, or already in the Redis
        protocol (bytes: the decision's hot path frames them itself)."""
        conn = self.take()
        try:
            if self.direct:
                reply = direct_call(conn, as_bytes(conn, command))
            else:
                reply = call(conn, command)
        except BaseException as exc:
            return drive(recovered(self, conn, command, source, exc, again))
        self._idle.append(conn)
        return reply

    def send(self, conn: Any, command: Command) -> Any:
        """One command on a connection this stack took."""
        return direct_call(conn, as_bytes(conn, command)) if self.direct else call(conn, command)

    def settle(self, conn: Any, error: ResponseError) -> None:
        """After an error reply read whole: keep the connection, unless its server is gone."""
        if keeps(error):
            self._idle.append(conn)
        else:
            self.lost(conn, error)

    def lost(self, conn: Any, error: BaseException) -> None:
        """Close a connection that failed; after a store error, the idle ones too."""
        conn.disconnect()
        if isinstance(error, Exception):  # not a thread interrupted mid-command
            self.disconnect()

    def disconnect(self) -> None:
        idle, self._idle = self._idle, _emptied(self._idle)
        for conn in idle:
            conn.disconnect()

    def close(self) -> None:
        """disconnect() for good: a connection given back later (by a decision another thread
        had in flight) is closed, not kept where nothing would close it."""
        idle, self._idle = self._idle, _Closing(_disconnect)
        for conn in idle:
            conn.disconnect()

    def _forget(self) -> None:
        # In a forked child the sockets are the parent's: drop them without a word on the
        # wire (redis-py's Connection only closes the child's descriptor).
        self._idle = _emptied(self._idle)


class _Closing(list[Any]):
    """A closed stack's idle connections: none, each one given back closed at once by
    ``close``."""

    def __init__(self, close: Callable[[Any], object]) -> None:
        super().__init__()
        self.close = close

    def append(self, conn: Any) -> None:
        self.close(conn)


def _emptied(idle: list[Any]) -> list[Any]:
    """A stack's idle list once its connections are taken out: closed if it was."""
    return idle if isinstance(idle, _Closing) else []


def _disconnect(conn: Any) -> None:
    conn.disconnect()


def call(conn: Any, command: Command) -> Any:
    packed = [command] if isinstance(command, bytes) else conn.pack_command(*command)
    conn.send_packed_command(packed)  # connects a new one
    return conn.read_response()


# What a packed EVALSHA of a script's sha starts with, after its count of arguments.
_EVALSHA_HEAD = b"$7\r\nEVALSHA\r\n$40\r\n"
_SHA_AND_CRLF = 42


def as_eval(command: Command, source: str) -> Command:
    """An EVALSHA ``command`` as the EVAL of ``source`` with the same keys and arguments."""
    if not isinstance(command, bytes):
        return ("EVAL", source, *command[2:])
    head = command.index(b"\r\n") + 2  # *<count>\r\n: EVAL takes as many arguments
    if not command.startswith(_EVALSHA_HEAD, head):
        raise ValueError(f"not an EVALSHA of a script's sha: {command[:64]!r}")
    body = source.encode("utf-8")
    rest = command[head + len(_EVALSHA_HEAD) + _SHA_AND_CRLF :]
    return b"%s$4\r\nEVAL\r\n$%d\r\n%s\r\n%s" % (command[:head], len(body), body, rest)


def reloaded(send: Callable[[Command], Any], command: Command, source: str) -> Steps[Any]:
    """After NOSCRIPT: the script run from its source, EVAL caching it as it runs it; one round
    trip, so a SCRIPT FLUSH from elsewhere cannot come between loading and running it. Where
    an ACL refuses EVAL (docs/deploying.md's user before it allowed it), loaded, then run."""
    try:
        return (yield send, (as_eval(command, source),))
    except NoPermissionError:
        yield send, (("SCRIPT", "LOAD", source),)
        return (yield send, (command,))


def recovered(
    stack: Any, conn: Any, command: Command, source: str, error: BaseException, again: bool
) -> Steps[Any]:
    """What follows a script call on ``conn`` that raised ``error``, for every stack (steps
    driven by drive() or adrive(): its ``send``, ``settle``, ``lost`` and ``run_packed`` are
    sync or async alike). NOSCRIPT is a reload on the same connection (reloaded()); an error
    reply keeps the connection unless its server is gone; anything else closes it; a server
    that has become a replica gets the call once more, on a new connection, as does one fenced
    while a replica it lost answers as the primary (``stack.promoted``)."""
    try:
        if not isinstance(error, NoScriptError):
            raise error
        reply = yield from reloaded(partial(stack.send, conn), command, source)
    except ResponseError as exc:
        yield stack.settle, (conn, exc)
        if again and (demoted(exc) or (fenced(exc) and (yield stack.promoted, (conn,)))):
            return (yield stack.run_packed, (command, source, False))
        raise
    except BaseException as exc:
        yield stack.lost, (conn, exc)  # timed out, broken or cancelled: its reply may still come
        if again and demoted(exc):
            return (yield stack.run_packed, (command, source, False))
        raise
    stack.give(conn)
    return reply


def reads_directly(conn: Any) -> bool:
    """Whether replies on connections like ``conn`` (made, not connected) can be read through
    hiredis's reader directly: a plain connection with hiredis's parser and no health checks
    (whose PING redis-py sends before a command)."""
    return (
        type(conn) in DIRECT_CONNECTIONS
        and type(getattr(conn, "_parser", None)) is hiredis_parser._HiredisParser
        and not conn.health_check_interval
    )


def as_bytes(conn: Any, command: Command) -> bytes:
    """A command in the Redis protocol, as one byte string."""
    return command if isinstance(command, bytes) else b"".join(conn.pack_command(*command))


def direct_call(conn: Any, command: bytes) -> Any:
    """call() on a connected connection that reads_directly, without redis-py's layers around
    the socket and the reader: one ``sendall``, then reads until hiredis has the reply. Errors
    are redis-py's, in its words, and close the connection as its own would (an error reply
    read whole does not)."""
    sock = conn._sock
    parser = conn._parser
    reader = parser._reader
    push = getattr(parser, "_hiredis_PushNotificationType", None)  # RESP3's out-of-band data
    try:
        sock.sendall(command)
    except (TimeoutError, BlockingIOError) as exc:  # BlockingIOError: the kernel's timeout
        conn.disconnect()
        raise RedisTimeoutError("Timeout writing to socket") from exc
    except OSError as exc:
        conn.disconnect()
        errno, message = ("UNKNOWN", exc.args[0]) if len(exc.args) == 1 else exc.args[:2]
        raise ConnectionError(f"Error {errno} while writing to socket. {message}.") from exc
    except BaseException:
        conn.disconnect()  # cut short mid-write: the connection is never used again
        raise
    try:
        while True:
            reply = reader.gets()
            while reply is _NOT_ENOUGH_DATA:
                buffer = parser._buffer
                size = sock.recv_into(buffer)
                if size == 0:
                    raise ConnectionError(_SERVER_CLOSED)
                reader.feed(buffer, 0, size)
                reply = reader.gets()
            if push is None or type(reply) is not push:
                break
            parser.handle_push_response(reply)  # redis-py's handlers, then the reply
    except (TimeoutError, BlockingIOError) as exc:
        conn.disconnect()
        raise RedisTimeoutError("Timeout reading from socket") from exc
    except OSError as exc:
        conn.disconnect()
        raise ConnectionError(
            f"Error while reading from {conn._host_error()} : {exc.args}"
        ) from exc
    except BaseException:
        conn.disconnect()
        raise
    if isinstance(reply, Exception):  # an error reply: hiredis returns redis-py's exception
        if isinstance(reply, ConnectionError):  # LOADING: the server cannot serve yet
            conn.disconnect()
        raise reply
    return reply


def kernel_timeouts(conn: Any) -> None:
    """Bound a connected socket's sends and receives by the connection's timeout in the kernel
    (KERNEL_TIMEOUTS), for direct_call(): one syscall per send or receive."""
    timeout = conn.socket_timeout
    sock = conn._sock
    if not KERNEL_TIMEOUTS or not timeout or sock is None:
        return
    seconds = int(timeout)
    micros = min(999_999, round((timeout - seconds) * 1_000_000))
    if not seconds and not micros:
        micros = 1  # a zero timeval is no limit at all
    limit = struct.pack("@ll", seconds, micros)  # struct timeval
    sock.settimeout(None)  # blocking: no poll() before each call
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)


def _readable(conn: Any) -> bool:
    """Whether a connection that reads_directly has something to read before a command was
    sent: a reply left over, or the server's close (redis-py's can_read() tells the two apart;
    the stack replaces the connection either way)."""
    reader = conn._parser._reader
    if reader is None or reader.has_data():
        return True
    sock = conn._sock
    # The connection's socket and a poll object watching it, kept on the connection: one
    # syscall per decision instead of redis-py's new poll object and registration each time.
    watch = getattr(conn, _WATCH, None)
    if watch is None or watch[0] is not sock:
        poll = select.poll()
        poll.register(sock, select.POLLIN)
        watch = (sock, poll)
        setattr(conn, _WATCH, watch)
    return bool(watch[1].poll(0))


_WATCH = "_django_throttle_poll"
_PRIMARY = "_django_throttle_primary"  # the (host, port) a Sentinel connection reached


# Connects a stack of an event loop makes at a time. A burst of decisions on a new (or
# emptied) stack waits for a connection given back or made, rather than opening one each:
# twenty connects at once on a busy loop each wait on the others' turns.
MAX_CONNECTING = 1


class LoopStack:
    """What the event loop's stacks share (the store, and so each stack, is built per loop):
    idle connections, the connects made one at a time (MAX_CONNECTING), the script policy
    (recovered()) and the connections a failure closes. A stack's own I/O: ``_connect``,
    ``_usable``, ``_close`` and ``send``."""

    def __init__(self) -> None:
        self._idle: list[Any] = []
        # Decisions waiting for a connection: given one, None when they may connect, or the
        # error of the connect they waited for.
        self._waiters: deque[asyncio.Future[Any]] = deque()
        self._connecting = 0
        self._closing: set[asyncio.Task[None]] = set()  # _drop()'s, held until they end

    async def _connect(self) -> Any:
        raise NotImplementedError

    async def _usable(self, conn: Any) -> bool:
        """Whether an idle connection may be used (else it is closed)."""
        raise NotImplementedError

    async def _close(self, conn: Any) -> None:
        raise NotImplementedError

    def _drop(self, conn: Any) -> None:
        """Close a connection given back after disconnect(), from the code giving it back."""
        task = asyncio.get_running_loop().create_task(self._close(conn))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def send(self, conn: Any, command: Command) -> Any:
        """One command on a connection this stack took: an awaitable of its reply."""
        raise NotImplementedError

    async def promoted(self, conn: Any) -> bool:
        """ConnectionStack.promoted() on the loop; redis.asyncio's connections keep following
        the fail modes after NOREPLICAS (the lean connection's stack finds the new primary)."""
        return False

    async def take(self) -> Any:
        while True:
            idle = self._idle
            while idle:
                conn = idle.pop()
                if await self._usable(conn):
                    if self._waiters and self._connecting < MAX_CONNECTING:
                        self.give(None)  # a waiter connects meanwhile
                    return conn
            if self._connecting < MAX_CONNECTING:
                return await self._connect_one()
            conn = await self._wait()
            # Handed on after its last reply, it may have been closed since (a Sentinel
            # demotion's CLIENT KILL): nothing was sent on it, so no fault; wait on.
            if conn is not None and await self._usable(conn):
                return conn

    async def _connect_one(self) -> Any:
        self._connecting += 1
        try:
            conn = await self._connect()
        except Exception as exc:  # the server's answer: the waiters' connects would get it too
            self._connecting -= 1
            waiters, self._waiters = self._waiters, deque()
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(exc)
            raise
        except BaseException:  # cancelled: the next waiter connects instead
            self._connecting -= 1
            self.give(None)
            raise
        self._connecting -= 1
        self.give(None)  # the next connection is made while this one serves
        return conn

    async def _wait(self) -> Any:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            # Handed a connection (or the turn to connect) as it was cancelled: pass it on.
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.give(waiter.result())
            raise

    def give(self, conn: Any) -> None:
        """Hand a connection to the first waiter, else keep it idle; None hands the first
        waiter its turn to connect."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is not None:
            self._idle.append(conn)

    async def run_script(self, sha: str, source: str, *args: Any) -> Any:
        return await self.run_packed(("EVALSHA", sha, *args), source)

    async def run_packed(self, command: Command, source: str, again: bool = True) -> Any:
        conn = await self.take()
        try:
            reply = await self.send(conn, command)
        except BaseException as exc:
            return await adrive(recovered(self, conn, command, source, exc, again))
        if self._waiters:
            self.give(conn)
        else:
            self._idle.append(conn)
        return reply

    async def settle(self, conn: Any, error: ResponseError) -> None:
        """After an error reply read whole: keep the connection, unless its server is gone."""
        if keeps(error):
            self.give(conn)
        else:
            await self.lost(conn, error)

    async def lost(self, conn: Any, error: BaseException) -> None:
        """Close a connection that failed; after a store error, the idle ones too."""
        await self._close(conn)
        if isinstance(error, Exception):  # not a cancelled task: the server failed
            idle, self._idle = self._idle, _emptied(self._idle)
            for other in idle:
                await self._close(other)
        self.give(None)  # it is not given back: a waiter connects instead

    async def disconnect(self) -> None:
        """Close the connections for good (the store closes): one a decision in flight gives
        back later is closed then, not kept where nothing would close it."""
        idle, self._idle = self._idle, _Closing(self._drop)
        for conn in idle:
            await self._close(conn)
        waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionError("the store's connections were closed"))


class AsyncConnectionStack(LoopStack):
    """LoopStack over redis.asyncio's connections.

    ``one_deadline``: the socket timeout bounds each command as a whole, and the connect
    timeout (plus the socket timeout, for the handshake) a new connection, each timed by the
    server's answer rather than the loop's turns (store/deadlines.py); instead of redis-py's
    timeout per send and per read, whose send goes through ``asyncio.wait_for``. A command
    past its deadline raises redis-py's TimeoutError, as redis-py's own would."""

    def __init__(self, pool: Any, *, one_deadline: bool = False, **overrides: Any) -> None:
        super().__init__()
        self.pool = pool  # a pool, or anything with its connection_class and connection_kwargs
        self._connection_class = pool.connection_class
        self._kwargs = {**pool.connection_kwargs, **overrides}
        timeout = self._kwargs.get("socket_timeout")
        self._deadline: float | None = timeout if one_deadline and timeout else None
        self._connect_deadline: float | None = None
        if self._deadline is not None:
            self._connect_deadline = self._deadline + (
                self._kwargs.get("socket_connect_timeout") or self._deadline
            )
            # Timed here as a whole: none of redis-py's own per connect and per read.
            self._kwargs.update(socket_timeout=None, socket_connect_timeout=None)

    async def _connect(self) -> Any:
        conn = self._connection_class(**self._kwargs)
        await within(
            self._connect_deadline,
            conn.connect(),
            partial(answered_on, conn),
            lambda: RedisTimeoutError("Timeout connecting to the store"),
            stretch=True,  # until its transport exists, its socket cannot be asked
        )
        return conn

    async def _usable(self, conn: Any) -> bool:
        try:
            if not await _can_read(conn):
                return True
        except ConnectionError:
            pass
        await conn.disconnect(nowait=True)
        return False

    async def _close(self, conn: Any) -> None:
        await conn.disconnect(nowait=True)

    def send(self, conn: Any, command: Command) -> Any:
        return within(
            self._deadline,
            acall(conn, command),
            partial(answered_on, conn),
            lambda: RedisTimeoutError("Timeout reading from the store"),
        )


async def _can_read(conn: Any) -> bool:
    # redis-py 8 renamed can_read_destructive() to can_read(); 5.x has only the former.
    reader = getattr(conn, "can_read", None) or conn.can_read_destructive
    return bool(await reader())


async def acall(conn: Any, command: Command) -> Any:
    packed = [command] if isinstance(command, bytes) else conn.pack_command(*command)
    await conn.send_packed_command(packed)
    return await conn.read_response()


def _after_fork() -> None:
    for stack in list(_stacks):
        stack._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
