"""The async decision call's lean connection (store/aio_connection.py), against real
redis-server processes: replies belong to their command, a command is bounded by the socket
timeout as a whole, a connection that timed out, broke or was closed is never used again, the
handshake authenticates and selects, and the pools it does not serve keep redis.asyncio's."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio
from redis.credentials import UsernamePasswordCredentialProvider
from redis.exceptions import (
    AuthenticationError,
    ConnectionError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from django_throttle.store import aio_connection
from django_throttle.store.aio_connection import LeanConnectionStack, async_stack
from django_throttle.store.connections import AsyncConnectionStack
from django_throttle.store.redis import AsyncRedisStore
from tests.redis_server import RedisServer
from tests.traffic import wait_until

T = TypeVar("T")
TIMEOUT = 0.2
SHA_ONE = "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"  # of "return 1"
NAME = "lean-under-test"


def lean(url: str, **kwargs: Any) -> tuple[Any, LeanConnectionStack]:
    client = redis.asyncio.Redis.from_url(
        url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT, **kwargs
    )
    stack = async_stack(client.connection_pool, one_deadline=True)
    assert isinstance(stack, LeanConnectionStack)
    return client, stack


def with_stack(url: str, body: Callable[[LeanConnectionStack], Awaitable[T]], **kwargs: Any) -> T:
    async def run() -> T:
        client, stack = lean(url, **kwargs)
        try:
            return await body(stack)
        finally:
            await stack.disconnect()
            await client.aclose()

    return asyncio.run(run())


@pytest.fixture
def managed(redis_server: RedisServer) -> RedisServer:
    if not redis_server.managed:
        pytest.skip("needs a redis-server the harness runs; unset REDIS_URL")
    return redis_server


def test_replies_come_back_to_their_command(redis_server: RedisServer) -> None:
    async def body(stack: LeanConnectionStack) -> list[Any]:
        return [
            await stack.execute("SET", "k", "v"),
            await stack.execute("GET", "k"),
            await stack.execute("INCRBY", "n", 5),
            await stack.execute("INCRBY", "n", 2),
            await stack.execute("GET", "missing"),
            await stack.execute("EVAL", "return {1, 'a', {2}}", 0),
        ]

    assert with_stack(redis_server.url, body) == [b"OK", b"v", 5, 7, None, [1, b"a", [2]]]


def test_one_connection_serves_calls_in_turn_and_error_replies_keep_it(
    redis_server: RedisServer,
) -> None:
    async def body(stack: LeanConnectionStack) -> tuple[set[int], type]:
        ids = {await stack.execute("CLIENT", "ID") for _ in range(10)}
        with pytest.raises(NoScriptError) as raised:
            await stack.execute("EVALSHA", "0" * 40, 0)
        with pytest.raises(ResponseError):
            await stack.execute("INCR")  # wrong number of arguments
        ids.add(await stack.execute("CLIENT", "ID"))
        return ids, raised.type

    ids, error = with_stack(redis_server.url, body)
    assert len(ids) == 1
    assert error is NoScriptError  # mapped to redis-py's class, as its parser does


def test_noscript_loads_the_script_on_the_same_connection(redis_server: RedisServer) -> None:
    async def body(stack: LeanConnectionStack) -> list[Any]:
        first = await stack.execute("CLIENT", "ID")
        got = [await stack.run_script(SHA_ONE, "return 1", 0)]  # not loaded yet: loaded
        await stack.execute("SCRIPT", "FLUSH")
        got.append(await stack.run_script(SHA_ONE, "return 1", 0))  # flushed: loaded again
        got.append(await stack.execute("CLIENT", "ID") == first)
        return got

    assert with_stack(redis_server.url, body) == [1, 1, True]


def test_a_command_is_bounded_by_the_timeout_and_its_connection_dropped(
    managed: RedisServer,
) -> None:
    """A server that stops answering (SIGSTOP) fails the command after the socket timeout,
    with redis-py's TimeoutError; the idle connection, then a new one, each time out; the
    connection is never reused, and once the server is back the next command works."""

    async def body(stack: LeanConnectionStack) -> tuple[list[float], Any]:
        assert await stack.run_script(SHA_ONE, "return 1", 0) == 1
        took = []
        managed.pause()
        try:
            for _ in range(2):  # the idle connection, then a new one
                started = time.monotonic()
                with pytest.raises(RedisTimeoutError):
                    await stack.run_script(SHA_ONE, "return 1", 0)
                took.append(time.monotonic() - started)
                assert stack._idle == []
        finally:
            managed.resume()
        return took, await stack.run_script(SHA_ONE, "return 1", 0)

    took, after = with_stack(managed.url, body)
    assert all(0.15 <= t < 1.0 for t in took), took
    assert after == 1


def test_a_late_reply_is_never_read_as_the_next_answer(redis_server: RedisServer) -> None:
    async def body(stack: LeanConnectionStack) -> list[Any]:
        first = await stack.execute("CLIENT", "ID")
        with pytest.raises(RedisTimeoutError):
            await stack.execute("DEBUG", "SLEEP", "0.4")  # answers "OK" after the timeout
        await asyncio.sleep(0.4)
        return [
            await stack.execute("SET", "after", "1"),
            await stack.execute("GET", "after"),
            await stack.execute("CLIENT", "ID") != first,
        ]

    assert with_stack(redis_server.url, body) == [b"OK", b"1", True]


def test_each_command_of_a_busy_connection_gets_its_whole_timeout(
    redis_server: RedisServer,
) -> None:
    """One timer per connection, re-armed at the deadline of the command in flight: a command
    sent long after the first one still gets its whole timeout, not what was left of it."""

    async def body(stack: LeanConnectionStack) -> Any:
        await stack.execute("PING")
        await asyncio.sleep(TIMEOUT * 0.75)  # the first command's timer has not fired yet
        return await stack.execute("DEBUG", "SLEEP", str(TIMEOUT * 0.5))

    assert with_stack(redis_server.url, body) == b"OK"


def test_a_cancelled_command_closes_its_connection(managed: RedisServer) -> None:
    async def body(stack: LeanConnectionStack) -> Any:
        first = await stack.execute("CLIENT", "ID")
        task = asyncio.ensure_future(stack.execute("DEBUG", "SLEEP", "0.1"))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert stack._idle == []
        return await stack.execute("CLIENT", "ID") != first

    assert with_stack(managed.url, body) is True


def test_a_connection_the_server_closed_while_idle_is_replaced(
    redis_server: RedisServer, redis_client: Any
) -> None:
    async def body(stack: LeanConnectionStack) -> list[Any]:
        first = await stack.execute("CLIENT", "ID")
        redis_client.client_kill_filter(_id=first)
        await asyncio.sleep(0.05)  # the loop reads the close while the connection is idle
        assert stack._idle[0].closed
        return [await stack.execute("PING"), await stack.execute("CLIENT", "ID") != first]

    assert with_stack(redis_server.url, body) == [b"PONG", True]


def test_a_waiting_decision_handed_a_connection_the_server_closed_waits_for_an_open_one(
    managed: RedisServer,
) -> None:
    """A decision waiting its turn (the one connect at a time is being made) may be handed a
    connection that the server closed after its last reply (a Sentinel demotion's CLIENT KILL):
    it is not sent on, and the decision waits for an open connection."""

    async def body(stack: LeanConnectionStack) -> list[Any]:
        held = await stack.take()
        with managed.client() as admin:
            admin.client_kill_filter(_id=await held.send(aio_connection.pack(("CLIENT", "ID"))))
        await asyncio.sleep(0.05)  # the loop reads the close
        assert held.closed
        managed.pause()  # the next connect waits for the server's answer to its handshake
        try:
            connecting = asyncio.ensure_future(stack.take())
            waiting = asyncio.ensure_future(stack.take())
            await asyncio.sleep(0.01)
            stack.give(held)  # as run_packed() hands a connection on after its reply
            await asyncio.sleep(0.01)
            handed_on = waiting.done()
        finally:
            managed.resume()
        got, made = await asyncio.gather(waiting, connecting)
        reply = await got.send(aio_connection.pack(("PING",)))
        stack.give(got)
        stack.give(made)
        return [handed_on, got is held, reply]

    assert with_stack(managed.url, body) == [False, False, b"PONG"]


@pytest.mark.parametrize("kind", ["lean", "redis.asyncio"])
def test_a_connection_given_back_after_the_store_closed_is_closed(
    managed: RedisServer, redis_client: Any, kind: str
) -> None:
    """A decision in flight as its store closes (the runtime rebuilt, the loop's store closed)
    gives its connection back once the reply comes: it is closed then, not kept open in a
    stack nothing will close (the garbage collector would, with a ResourceWarning)."""

    def named() -> set[int]:
        return {int(c["id"]) for c in redis_client.client_list() if c["name"] == NAME}

    async def body() -> list[Any]:
        client = redis.asyncio.Redis.from_url(
            managed.url, socket_timeout=1.0, socket_connect_timeout=1.0, client_name=NAME
        )
        pool = client.connection_pool
        stack: Any = (
            async_stack(pool, one_deadline=True)
            if kind == "lean"
            else AsyncConnectionStack(pool, one_deadline=True)
        )
        assert isinstance(stack, LeanConnectionStack) == (kind == "lean")
        await stack.run_script(SHA_ONE, "return 1", 0)  # one idle connection, the script loaded
        managed.pause()  # what is sent now is answered once the server resumes
        try:
            in_flight = asyncio.ensure_future(stack.run_script(SHA_ONE, "return 1", 0))
            await asyncio.sleep(0.05)  # sent on the idle connection
            await stack.disconnect()  # as the store's aclose() does
        finally:
            managed.resume()
        reply = await in_flight
        await asyncio.sleep(0.05)  # a redis.asyncio connection is closed by a task
        await client.aclose()
        return [reply, stack._idle == []]

    assert asyncio.run(body()) == [1, True]
    # (The server learns of a close on its next turn: looked for until it has.)
    wait_until(lambda: named() == set(), within=5)


def test_a_server_killed_while_idle_raises_once_and_recovers(managed: RedisServer) -> None:
    async def body(stack: LeanConnectionStack) -> Any:
        await stack.execute("PING")
        managed.kill()
        with pytest.raises(ConnectionError):
            await stack.execute("PING")
        managed.start()
        return await stack.execute("PING")

    assert with_stack(managed.url, body) == b"PONG"


@pytest.fixture
def password_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    with server.client() as admin:
        admin.config_set("requirepass", "sesame")
    try:
        yield server
    finally:
        server.close()


def test_auth_with_a_password_and_select(password_server: RedisServer) -> None:
    url = f"redis://:sesame@127.0.0.1:{password_server.port}/3"

    async def body(stack: LeanConnectionStack) -> Any:
        await stack.execute("SET", "here", "yes")
        return await stack.execute("CLIENT", "INFO")

    info = with_stack(url, body, client_name=NAME)
    assert b" db=3 " in info and f"name={NAME} ".encode() in info
    with redis.Redis(port=password_server.port, password="sesame", db=3) as check:
        assert check.get("here") == b"yes"


def test_auth_with_a_user_and_a_wrong_password(password_server: RedisServer) -> None:
    with password_server.client(password="sesame") as admin:
        admin.execute_command("ACL", "SETUSER", "deciding", "on", ">pw", "~*", "+@all")
    url = f"redis://deciding:pw@127.0.0.1:{password_server.port}/0"

    async def whoami(stack: LeanConnectionStack) -> Any:
        return await stack.execute("ACL", "WHOAMI")

    assert with_stack(url, whoami) == b"deciding"

    async def refused(stack: LeanConnectionStack) -> None:
        with pytest.raises(AuthenticationError):
            await stack.execute("PING")

    with_stack(f"redis://deciding:wrong@127.0.0.1:{password_server.port}/0", refused)


def test_a_unix_socket(managed: RedisServer) -> None:
    path = os.path.join(tempfile.mkdtemp(prefix="throttle-sock-"), "redis.sock")
    server = RedisServer(args=["--unixsocket", path, "--unixsocketperm", "700"])
    server.start()
    try:

        async def body(stack: LeanConnectionStack) -> Any:
            return await stack.run_script(SHA_ONE, "return 1", 0)

        assert with_stack(f"unix://{path}", body) == 1
    finally:
        server.close()


def test_a_replica_refuses_writes_once_more_on_a_new_connection(managed: RedisServer) -> None:
    """READONLY: the connection and the idle ones are dropped, the decision sent once more."""
    replica = RedisServer(args=["--replicaof", "127.0.0.1", str(managed.port)])
    replica.start()
    try:

        async def body(stack: LeanConnectionStack) -> list[Any]:
            await stack.execute("SCRIPT", "LOAD", source)
            with pytest.raises(ReadOnlyError):
                await stack.run_script(sha, source, 1, "k")
            return stack._idle

        source = "return redis.call('INCR', KEYS[1])"
        sha = hashlib.sha1(source.encode()).hexdigest()
        assert with_stack(replica.url, body) == []
        with replica.client() as check:
            calls = check.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        assert calls == 2  # the first try and one retry
    finally:
        replica.close()


def test_the_decision_store_uses_lean_connections(redis_server: RedisServer) -> None:
    store = AsyncRedisStore(redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=1.0))
    assert isinstance(store._stack, LeanConnectionStack)


class OwnConnection(redis.asyncio.Connection):
    """A connection class of one's own: it may do anything when it connects."""


@pytest.mark.parametrize(
    "kwargs",
    [
        {"connection_class": OwnConnection},
        {"credential_provider": UsernamePasswordCredentialProvider("u", "p")},
    ],
    ids=["own-connection-class", "credential-provider"],
)
def test_other_pools_keep_redis_asyncio_connections(
    redis_server: RedisServer, kwargs: dict[str, Any]
) -> None:
    pool = redis.asyncio.ConnectionPool(host="127.0.0.1", port=redis_server.port, **kwargs)
    assert isinstance(async_stack(pool, one_deadline=True), AsyncConnectionStack)


def test_without_hiredis_redis_asyncio_connections(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aio_connection, "HIREDIS", False)
    pool = redis.asyncio.ConnectionPool.from_url(redis_server.url)
    assert isinstance(async_stack(pool, one_deadline=True), AsyncConnectionStack)
