"""store/server_timed.py: redis.asyncio connections (those the cluster client reads the slot
map on) whose connect and replies are timed by the server's answer, not by the loop's turns:
a busy loop with a healthy server fails nothing; a server that says nothing still times out."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser
from redis.asyncio.connection import Connection
from redis.exceptions import TimeoutError as RedisTimeoutError

from django_throttle.store.connections import AsyncConnectionStack
from django_throttle.store.server_timed import PlainOptions, plain_options, server_timed
from tests.helpers import busy_loop, run
from tests.redis_server import RedisServer

TIMEOUT = 0.1


def timed(server: RedisServer) -> Any:
    return server_timed(Connection)(
        host="127.0.0.1", port=server.port, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT
    )


def timed_out(error: BaseException, took: float) -> None:
    """The read failed as a timeout, by the deadline (not by a hang stopped elsewhere)."""
    assert isinstance(error, RedisTimeoutError) and "Timeout reading" in str(error)
    assert took < 10 * TIMEOUT


async def ping(conn: Any) -> Any:
    await conn.send_command("PING")
    return await conn.read_response()


def test_a_busy_loop_fails_no_connect_and_no_reply(redis_server: RedisServer) -> None:
    """Fresh connections on a loop that works 50 ms per turn (several turns to connect and
    shake hands, each longer than half the timeout): every one is made and answered."""

    async def body() -> list[Any]:
        _, stop = busy_loop()
        replies = []
        try:
            for _ in range(5):
                conn = timed(redis_server)
                try:
                    replies.append(await ping(conn))
                finally:
                    await conn.disconnect()
        finally:
            stop()
        return replies

    assert run(body) == [b"PONG"] * 5


def test_a_server_that_says_nothing_still_times_out(redis_server: RedisServer) -> None:
    if not redis_server.managed:
        pytest.skip("needs a redis-server the harness runs; unset REDIS_URL")

    async def body() -> tuple[Any, float]:
        conn = timed(redis_server)
        await ping(conn)  # connected while the server answers
        redis_server.pause()
        started = time.monotonic()
        try:
            with pytest.raises(RedisTimeoutError) as raised:
                await ping(conn)
            return raised.value, time.monotonic() - started
        finally:
            redis_server.resume()
            await conn.disconnect()

    timed_out(*run(body))


@pytest.mark.parametrize("parser", [_AsyncRESP2Parser, _AsyncHiredisParser])
@pytest.mark.parametrize("kind", ["server-timed connection", "stack with one deadline"])
def test_part_of_a_reply_then_silence_times_out(kind: str, parser: type) -> None:
    """A server that sends part of a reply, then nothing: the deadline passes. (redis-py's
    own parser waits in the stream for the rest; what it holds there is no answer.) Both
    users of the server's answer: the cluster client's connections and the stacks of
    redis.asyncio's connections."""

    async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The handshake's commands answered (CLIENT SETINFO), the command's reply cut short.
        replies = {b"PING": b"$10\r\nabc", b"EVALSHA": b"$10\r\nabc"}
        while line := await reader.readline():
            words = [
                (await reader.readexactly(int((await reader.readline())[1:]) + 2))[:-2]
                for _ in range(int(line[1:]))
            ]
            writer.write(replies.get(words[0].upper(), b"+OK\r\n"))
        writer.close()

    async def body() -> tuple[BaseException, float]:
        server = await asyncio.start_server(half, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        options = {
            "host": "127.0.0.1",
            "port": port,
            "socket_timeout": TIMEOUT,
            "socket_connect_timeout": TIMEOUT,
            "parser_class": parser,
            "protocol": 2,  # no HELLO
        }
        started = time.monotonic()
        try:
            if kind == "server-timed connection":
                conn = server_timed(Connection)(**options)
                try:
                    call = asyncio.wait_for(ping(conn), 5)
                    with pytest.raises(RedisTimeoutError) as raised:
                        await call
                finally:
                    await conn.disconnect()
            else:
                stack = AsyncConnectionStack(PlainOptions(Connection, options), one_deadline=True)
                try:
                    with pytest.raises(RedisTimeoutError) as raised:
                        await asyncio.wait_for(stack.run_script("0" * 40, "return 1", 0), 5)
                finally:
                    await stack.disconnect()
            return raised.value, time.monotonic() - started
        finally:
            server.close()
            await server.wait_closed()

    timed_out(*run(body))


def test_the_class_is_made_once_and_the_stacks_see_the_plain_one() -> None:
    timed_class = server_timed(Connection)
    assert server_timed(Connection) is timed_class
    assert server_timed(timed_class) is timed_class
    node = PlainOptions(timed_class, {"host": "127.0.0.1"})
    assert plain_options(node) == PlainOptions(Connection, {"host": "127.0.0.1"})
