"""The decision call's own connections (store/connections.py), against the real redis-server:
a reply always belongs to its command, stale and broken connections are never reused, threads
and forked children never share a socket."""

from __future__ import annotations

import asyncio
import os
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis._parsers import _RESP2Parser, _RESP3Parser
from redis.exceptions import (
    BusyLoadingError,
    ConnectionError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
    TimeoutError,
)

from django_throttle.store import Check, RedisStore
from django_throttle.store.connections import ConnectionStack, demoted, keeps
from django_throttle.store.guarded import GuardedStore

from .engine_helpers import make_rule
from .traffic import wait_until

# Stale connections are detected by the parser's can_read(), which differs per parser.
PARSERS = {
    "default": {},  # hiredis where installed (it is, with the test extra); RESP3 on redis-py 8
    "resp2-hiredis": {"protocol": 2},
    "resp2-python": {"parser_class": _RESP2Parser},
    "resp3-python": {"parser_class": _RESP3Parser, "protocol": 3},
}


@pytest.fixture(params=list(PARSERS))
def stack(redis_server: Any, request: Any) -> Iterator[ConnectionStack]:
    client = redis_server.client(
        socket_timeout=0.2, socket_connect_timeout=0.2, client_name=NAME, **PARSERS[request.param]
    )
    stack = ConnectionStack.for_pool(client.connection_pool)
    assert stack is not None
    yield stack
    stack.disconnect()
    client.close()


NAME = "stack-under-test"  # set on every connection the stack makes, to tell them apart


def client_ids(redis_client: Any) -> set[int]:
    return {int(c["id"]) for c in redis_client.client_list() if c["name"] == NAME}


def test_replies_come_back_to_their_command(stack: ConnectionStack) -> None:
    assert stack.execute("SET", "k", "v") == b"OK"  # raw replies: no redis-py callbacks
    assert stack.execute("GET", "k") == b"v"
    assert stack.execute("INCRBY", "n", 5) == 5
    assert stack.execute("INCRBY", "n", 2) == 7


def test_hiredis_replies_are_read_directly(stack: ConnectionStack, request: Any) -> None:
    """Where hiredis parses, the stack reads its replies itself (every test here then covers
    that path); with redis-py's own parsers, through redis-py's Connection."""
    stack.execute("PING")
    parser = request.node.callspec.params["stack"]
    assert stack.direct is (parser in ("default", "resp2-hiredis"))


def test_pushes_never_take_a_commands_place(stack: ConnectionStack) -> None:
    """With RESP3 a tracking connection is pushed an invalidation of each key written (after
    the write's reply): a connection with a push pending is replaced before its next command,
    and each command gets its own reply."""
    if not isinstance(stack.execute("HELLO"), dict):  # a list in RESP2
        pytest.skip("pushes are RESP3's")
    first = stack.execute("CLIENT", "ID")
    assert stack.execute("CLIENT", "TRACKING", "ON", "BCAST") == b"OK"
    assert stack.execute("SET", "tracked", 1) == b"OK"  # an invalidation pushed to itself
    assert stack.execute("ECHO", "mine") == b"mine"
    assert stack.execute("CLIENT", "ID") != first


def test_a_stack_whose_connections_others_read_leaves_them_to_redis_py(
    redis_server: Any,
) -> None:
    """A cluster's stacks hand their connections to code that reads them through redis-py:
    they keep redis-py's reads and Python's socket timeout, which redis-py maps."""
    client = redis_server.client(socket_timeout=0.2)
    stack = ConnectionStack(client.connection_pool, direct_reads=False)
    conn = stack.take()
    try:
        assert not stack.direct
        assert conn._sock.gettimeout() == 0.2
    finally:
        stack.give(conn)
        stack.disconnect()
        client.close()


def test_a_reply_longer_than_one_read_comes_back_whole(stack: ConnectionStack) -> None:
    big = b"x" * 300_000  # several reads of redis-py's 64 KiB buffer
    assert stack.execute("SET", "big", big) == b"OK"
    assert stack.execute("GET", "big") == big
    assert stack.execute("ECHO", "next") == b"next"


def test_a_framed_script_is_loaded_on_the_connection_that_lacks_it(
    stack: ConnectionStack,
) -> None:
    first = stack.execute("CLIENT", "ID")
    stack.execute("SCRIPT", "FLUSH")
    command = b"*3\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n0\r\n" % SHA_ONE.encode()
    assert stack.run_packed(command, "return 1") == 1  # NOSCRIPT, SCRIPT LOAD, EVALSHA
    assert stack.run_packed(command, "return 1") == 1
    assert stack.execute("CLIENT", "ID") == first


def test_a_loading_reply_ends_the_connection(stack: ConnectionStack) -> None:
    """LOADING (a server still reading its data) is redis-py's BusyLoadingError, a
    ConnectionError: the connection is not used again."""
    first = stack.execute("CLIENT", "ID")
    with pytest.raises(BusyLoadingError):
        stack.execute("EVAL", "return redis.error_reply('LOADING Redis is loading')", 0)
    assert stack.execute("CLIENT", "ID") != first


def test_one_connection_serves_calls_in_turn(stack: ConnectionStack, redis_client: Any) -> None:
    first = stack.execute("CLIENT", "ID")
    for _ in range(20):
        assert stack.execute("CLIENT", "ID") == first
    assert client_ids(redis_client) == {first}


def test_an_error_reply_keeps_the_connection(stack: ConnectionStack) -> None:
    first = stack.execute("CLIENT", "ID")
    with pytest.raises(NoScriptError):
        stack.execute("EVALSHA", "0" * 40, 0)
    assert stack.execute("CLIENT", "ID") == first


def test_a_timed_out_connection_is_never_reused(stack: ConnectionStack, redis_server: Any) -> None:
    """Its late reply must not be read as the answer to the next command."""
    first = stack.execute("CLIENT", "ID")
    with redis_server.client() as other:
        with pytest.raises(TimeoutError):
            # The server sleeps past the 0.2 s socket timeout, then answers "OK" late.
            stack.execute("DEBUG", "SLEEP", "0.4")
        other.ping()  # served once the server is awake again
    assert stack.execute("SET", "after", "1") == b"OK"
    assert stack.execute("GET", "after") == b"1"
    assert stack.execute("CLIENT", "ID") != first


def test_a_write_the_server_does_not_read_times_out(
    stack: ConnectionStack, redis_server: Any
) -> None:
    """A command a stopped server does not read fails with redis-py's TimeoutError once the
    0.2 s socket timeout has passed (Linux: bounded by the kernel), never reused after."""
    if not redis_server.managed:
        pytest.skip("needs a redis-server the harness runs; unset REDIS_URL")
    import time

    first = stack.execute("CLIENT", "ID")
    redis_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="writing"):
            stack.execute("SET", "big", b"x" * 32_000_000)  # more than the socket buffers
        took = time.monotonic() - started
    finally:
        redis_server.resume()
    assert 0.15 <= took < 1.5, took
    assert stack.execute("CLIENT", "ID") != first


def test_a_connection_the_server_closed_is_replaced(
    stack: ConnectionStack, redis_client: Any
) -> None:
    first = stack.execute("CLIENT", "ID")
    redis_client.client_kill_filter(_id=first)
    assert stack.execute("PING") == b"PONG"  # no error: a fresh connection
    assert stack.execute("CLIENT", "ID") != first


def test_a_restarted_server_is_used_at_once(stack: ConnectionStack, redis_server: Any) -> None:
    stack.execute("SET", "k", "before")
    redis_server.restart()
    assert stack.execute("GET", "k") is None  # the new server answers; nothing is raised
    assert stack.execute("SET", "k", "after") == b"OK"


def test_a_server_that_is_down_raises_and_recovers(
    stack: ConnectionStack, redis_server: Any
) -> None:
    stack.execute("PING")
    redis_server.kill()
    with pytest.raises(redis.ConnectionError):
        stack.execute("PING")
    redis_server.start()
    assert stack.execute("PING") == b"PONG"


def test_threads_never_share_a_connection(redis_server: Any, redis_client: Any) -> None:
    """Eight threads deciding at once: each gets its own replies, the counts are exact, and
    no more connections are made than threads ran at once."""
    client = redis_server.client(client_name=NAME)
    store = RedisStore(client)
    rule = make_rule("fixed_window", limit=100_000)
    store.decide([Check(rule, "warm-up")])  # the script is loaded, on the client's connection
    barrier = threading.Barrier(8)
    remaining: list[list[int]] = [[] for _ in range(8)]

    def work(n: int) -> None:
        barrier.wait()
        for _ in range(200):
            remaining[n].append(store.decide([Check(rule, "shared")])[0].remaining)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen = sorted(r for per_thread in remaining for r in per_thread)
    # Every admission saw its own count: 1,600 distinct values, none repeated or lost.
    assert seen == list(range(100_000 - 1600, 100_000))
    # At most one connection per thread, plus the one the client loaded the script on.
    assert 2 <= len(client_ids(redis_client)) <= 8 + 1
    store.close()
    client.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_opens_its_own_connection(stack: ConnectionStack) -> None:
    parent_id = stack.execute("CLIENT", "ID")
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns when a process with threads forks; the child only runs the
        # code below and leaves with os._exit.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: report the connection id it uses, and exit at once
        try:
            os.write(write, str(stack.execute("CLIENT", "ID")).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child_id = int(pipe.read())
    os.waitpid(pid, 0)
    assert child_id != parent_id
    assert stack.execute("CLIENT", "ID") == parent_id  # the parent's socket is untouched
    assert stack.execute("ECHO", "still in step") == b"still in step"


def test_plain_pools_only(redis_server: Any) -> None:
    """Pools that route or cache (Sentinel, cluster, client-side caching) keep redis-py's path."""

    class RoutingPool(redis.ConnectionPool):
        pass

    pool = RoutingPool.from_url(redis_server.url)
    assert ConnectionStack.for_pool(pool) is None
    store = RedisStore(redis.Redis(connection_pool=pool))
    rule = make_rule("fixed_window", limit=2)
    assert [store.decide([Check(rule, "x")])[0].allowed for _ in range(3)] == [True, True, False]
    pool.disconnect()


# -- which error replies end a connection, and which decisions are sent once more -------------

READONLY_IN_SCRIPT_62 = (
    "ERR Error running script (call to f_0123): @user_script:1: @user_script: 1: "
    "-READONLY You can't write against a read only replica."
)


@pytest.mark.parametrize(
    ("error", "kept", "again"),
    [
        (ReadOnlyError("You can't write against a read only replica."), False, True),
        (ResponseError(READONLY_IN_SCRIPT_62), False, True),  # Redis 6.2 inside a script
        (ResponseError("MASTERDOWN Link with MASTER is down"), False, False),  # redis-py 5
        (ResponseError("ERR Error running script: attempt to compare nil"), True, False),
        (ResponseError("OOM command not allowed when used memory > 'maxmemory'."), True, False),
    ],
)
def test_error_replies_that_end_a_connection(error: Exception, kept: bool, again: bool) -> None:
    assert keeps(error) is kept  # type: ignore[arg-type]
    assert demoted(error) is again


def test_a_cancellation_while_handling_readonly_is_never_retried() -> None:
    cancelled = asyncio.CancelledError()
    cancelled.__context__ = ReadOnlyError("x")  # as if raised inside redis-py's handler
    assert not demoted(cancelled)
    sentinel_style = ConnectionError("The previous master is now a slave")
    sentinel_style.__context__ = ReadOnlyError("x")
    assert demoted(sentinel_style)


def test_the_framed_decision_is_the_command_redis_py_would_send(redis_server: Any) -> None:
    """The hot path frames decide.lua's EVALSHA itself from each rule's arguments framed at
    compile time; it sends, byte for byte, what redis-py packs from decide_input(): blocks,
    costs, shadow rules, a dry run, a calendar window, an override's own limit, a key prefix
    and an identity outside ASCII."""
    from dataclasses import replace

    from django_throttle.calendar_windows import CalendarWindows
    from django_throttle.compiled import build_rule
    from django_throttle.store.redis import DECIDE_SHA, ServerClock, decide_input, packed_decide

    month = build_rule(
        id=7,
        name="m",
        algorithm="fixed_window",
        limit=3,
        period=30 * 86400,
        calendar=CalendarWindows("month", 1, "Europe/Paris"),
    )
    rules = [
        make_rule("fixed_window", 5),
        make_rule("token_bucket", 10, burst=40, rule_id=2, block=60),
        make_rule("sliding_window_log", 1000, 60, action="log", rule_id=3),
        replace(make_rule("leaky_bucket", 9, rule_id=4), limit=12, burst=12),
        month,
    ]
    checks = [
        Check(rule, identity, cost)
        for rule, identity, cost in zip(
            rules,
            ["ip:203.0.113.7", "user:42", "header:clé", "ip:::1", "global"],
            [1, 3, 1, 12, 2],
            strict=True,
        )
    ]
    client = redis_server.client()
    conn = client.connection_pool.make_connection()  # packs only: never connected
    try:
        clock = ServerClock()
        for dry_run in (False, True):
            for some in (checks[:1], checks):
                expected = b"".join(
                    conn.pack_command("EVALSHA", DECIDE_SHA, *decide_input(some, dry_run, clock))
                )
                assert packed_decide(some, dry_run, clock) == expected
    finally:
        client.close()


def test_async_commands_have_one_deadline_and_the_handshake_its_own(redis_server: Any) -> None:
    """With ``one_deadline`` (the async decision store's stack), a command to a server that
    stopped answering fails with redis-py's TimeoutError after the socket timeout, its
    connection closed, not reused; a connection made while the server is stopped fails its
    handshake as quickly; and once the server is back, the next command works."""
    if not redis_server.managed:
        pytest.skip("needs a redis-server the harness runs; unset REDIS_URL")
    import time

    import redis.asyncio
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from django_throttle.store.connections import AsyncConnectionStack

    async def body() -> tuple[list[float], Any]:
        client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=0.2)
        stack = AsyncConnectionStack(client.connection_pool, one_deadline=True)
        try:
            assert await stack.run_script(SHA_ONE, "return 1", 0) == 1
            took = []
            redis_server.pause()
            try:
                for _ in range(2):  # the idle connection, then a new one
                    started = time.monotonic()
                    with pytest.raises(RedisTimeoutError):
                        await stack.run_script(SHA_ONE, "return 1", 0)
                    took.append(time.monotonic() - started)
                    assert stack._idle == []  # never reused
            finally:
                redis_server.resume()
            return took, await stack.run_script(SHA_ONE, "return 1", 0)
        finally:
            await stack.disconnect()
            await client.aclose()

    took, after = asyncio.run(body())
    assert all(0.15 <= t < 1.0 for t in took), took
    assert after == 1


SHA_ONE = "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"  # of "return 1"


def test_a_connection_given_back_after_the_store_closed_is_closed(
    redis_server: Any, redis_client: Any
) -> None:
    """A decision another thread has in flight as the store closes (settings changed, the
    runtime rebuilt) gives its connection back afterwards: it is closed then, not kept open
    in a stack nothing will close (the garbage collector would, with a ResourceWarning)."""
    client = redis_server.client(client_name=NAME)
    store = RedisStore(client)
    stack = store._stack
    assert stack is not None
    sent = threading.Event()

    def in_flight() -> None:
        conn = stack.take()
        sent.set()
        # The server answers 0.3 s later; meanwhile the store is closed.
        assert stack.send(conn, ("DEBUG", "SLEEP", "0.3")) == b"OK"
        stack.give(conn)

    thread = threading.Thread(target=in_flight)
    thread.start()
    assert sent.wait(5)
    store.close()
    thread.join()
    # (The server learns of a close on its next turn: looked for until it has.)
    wait_until(lambda: client_ids(redis_client) == set(), within=5)
    # A closed store still answers (a request that raced the close), on a connection it
    # closes after use.
    rule = make_rule("fixed_window", limit=10)
    assert store.decide([Check(rule, "late")])[0].allowed
    wait_until(lambda: client_ids(redis_client) == set(), within=5)
    client.close()


def test_closing_the_store_closes_the_connections_of_each_running_loop(
    settings: Any, redis_client: Any
) -> None:
    """close() (the settings changed, the runtime rebuilt) drops each event loop's store; one
    whose loop still runs, as a server's does, closes its connections on that loop at once,
    not when the loop ends."""
    default = settings.CACHES["default"]
    options = {**default.get("OPTIONS", {}), "CONNECTION_POOL_KWARGS": {"client_name": NAME}}
    settings.CACHES = {**settings.CACHES, "default": {**default, "OPTIONS": options}}
    store = GuardedStore()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        checks = [Check(make_rule("fixed_window", limit=10), "one")]
        decided = asyncio.run_coroutine_threadsafe(store.adecide(checks), loop).result(5)
        assert isinstance(decided, list) and decided[0].allowed
        assert client_ids(redis_client), "the loop's store decided on a connection of its own"
        store.close()
        wait_until(lambda: client_ids(redis_client) == set(), within=5)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
