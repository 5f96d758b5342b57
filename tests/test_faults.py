"""Faults done to the real redis-server, seen through the middleware: never a 500, each rule's
fail mode, the local fallback, the circuit breaker, and recovery without intervention."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import BusyLoadingError, OutOfMemoryError, ReadOnlyError

from django_throttle.rules import CompiledRule, get_rules
from django_throttle.signals import store_state_changed
from django_throttle.store import Check, RedisStore, state_key
from django_throttle.store.redis import DECIDE_SHA
from tests.helpers import rule, run
from tests.redis_server import RedisServer
from tests.traffic import wait_until as wait_for

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

TIMEOUT = 0.2  # the decision timeout of these tests: long enough to see who waited for it
RECOVERY_INTERVAL = 0.3  # BREAKER_INTERVAL of the recovery tests
MARGIN = 1.0  # generous slack for a loaded machine; the behaviour is what is asserted
LIMIT = 3

OPEN = "/api/items/"  # rule "open": fail_mode=open
CLOSED = "/users/1/"  # rule "closed": fail_mode=closed
DEFAULT = "/shop/named/"  # rule "default": fail_mode=default, i.e. FAIL_OPEN (True)
CLIENT = "ip:127.0.0.1"  # the test client's identity


# -- faults done to the server ------------------------------------------------------------


class Fault:
    """Breaks the real server (begin) and repairs it (end)."""

    error: type[Exception] = redis.RedisError  # what the store raises while it is broken
    hangs = False  # a request to the broken server waits for the decision TIMEOUT
    answers_info = False  # INFO works during the fault, so Redis's command counts can be read

    def __init__(self, server: RedisServer) -> None:
        self.server = server

    def begin(self) -> None:
        raise NotImplementedError

    def end(self) -> None:
        raise NotImplementedError

    def client(self) -> redis.Redis:
        return self.server.client(socket_timeout=5)


class Kill(Fault):
    """The server process dies: connection refused."""

    error = redis.ConnectionError

    def begin(self) -> None:
        self.server.kill()

    def end(self) -> None:
        self.server.start()


class Pause(Fault):
    """SIGSTOP: connections stay open, nothing is answered."""

    error = redis.TimeoutError
    hangs = True

    def begin(self) -> None:
        self.server.pause()

    def end(self) -> None:
        self.server.resume()


class OutOfMemory(Fault):
    """maxmemory below what is used, no eviction: the script's writes fail with OOM."""

    error = OutOfMemoryError
    answers_info = True

    def begin(self) -> None:
        with closing(self.client()) as client:
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", 1)

    def end(self) -> None:
        with closing(self.client()) as client:
            client.config_set("maxmemory", 0)


class Busy(Fault):
    """DEBUG SLEEP 1 from another connection: the server is busy, requests time out."""

    error = redis.TimeoutError
    hangs = True

    def begin(self) -> None:
        self.thread = threading.Thread(target=self._sleep)
        self.thread.start()
        # Wait until the server is really inside the DEBUG SLEEP.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with closing(self.server.client(socket_timeout=0.05)) as probe:
                try:
                    probe.ping()
                except redis.TimeoutError:
                    return
            time.sleep(0.01)
        raise AssertionError("the server never became busy")

    def _sleep(self) -> None:
        with closing(self.client()) as client:
            client.execute_command("DEBUG", "SLEEP", 1)

    def end(self) -> None:
        self.thread.join()


class ReadOnly(Fault):
    """The server made a replica of a second server it syncs from: writes fail with READONLY."""

    error = ReadOnlyError
    answers_info = True

    def begin(self) -> None:
        self.start_master()
        with closing(self.client()) as client:
            client.execute_command("REPLICAOF", "127.0.0.1", self.master.port)
            wait_for(lambda: synced(client), within=10)

    def start_master(self) -> None:
        self.master = RedisServer()
        self.master.start()
        with closing(self.master.client()) as master:
            master.config_set("repl-diskless-sync-delay", 0)  # sync at once, not after 5 s

    def end(self) -> None:
        try:
            with closing(self.client()) as client:
                client.execute_command("REPLICAOF", "NO", "ONE")
        finally:
            self.stop_master()

    def stop_master(self) -> None:
        self.master.close()
        # The replica kept the master's dataset as its dump.rdb; a restart would load it.
        Path(self.server.dir, "dump.rdb").unlink(missing_ok=True)


class Loading(ReadOnly):
    """The replica loads the dataset of its master (slowed by key-load-delay, a Redis test
    config): commands are answered with LOADING until it is done."""

    error = BusyLoadingError

    def begin(self) -> None:
        self.start_master()
        with closing(self.master.client()) as master:
            master.execute_command("DEBUG", "POPULATE", 1000, "filler", 2000)
        with closing(self.client()) as client:
            # About 0.5 s of loading, and events served between keys while it lasts.
            client.config_set("key-load-delay", 500)
            client.config_set("loading-process-events-interval-bytes", 1024)
            client.execute_command("REPLICAOF", "127.0.0.1", self.master.port)
            wait_for(lambda: client.info("persistence")["loading"] == 1, within=10, step=0.001)

    def end(self) -> None:
        try:
            with closing(self.client()) as client:
                wait_for(lambda: synced(client), within=10)
                client.execute_command("REPLICAOF", "NO", "ONE")
                client.config_set("key-load-delay", 0)
                client.flushall()  # the master's filler
        finally:
            self.stop_master()


FAULTS = [Kill, Pause, OutOfMemory, Busy, ReadOnly, Loading]


def synced(client: redis.Redis) -> bool:
    replication = client.info("replication")
    return (
        replication.get("master_link_status") == "up" and client.info("persistence")["loading"] == 0
    )


# -- fixtures and helpers -----------------------------------------------------------------


@pytest.fixture(params=FAULTS, ids=lambda fault: fault.__name__)
def fault(request: Any, redis_server: RedisServer) -> Iterator[Fault]:
    if not redis_server.managed:
        pytest.skip("faults are done to a redis-server the harness runs; unset REDIS_URL")
    yield request.param(redis_server)


@pytest.fixture
def configure(settings: Any) -> Any:
    """Set DJANGO_THROTTLE for the test (before any rule is created: a change resets state)."""

    def apply(**overrides: Any) -> None:
        settings.DJANGO_THROTTLE = {
            **settings.DJANGO_THROTTLE,
            "TIMEOUT": TIMEOUT,
            "CONNECT_TIMEOUT": TIMEOUT,
            **overrides,
        }

    return apply


@pytest.fixture
def states() -> Iterator[list[tuple[bool, Any]]]:
    """Every store_state_changed sent during the test, as (available, error)."""
    sent: list[tuple[bool, Any]] = []

    def receiver(sender: Any, available: bool, error: Any = None, **kwargs: Any) -> None:
        sent.append((available, error))

    store_state_changed.connect(receiver)
    yield sent
    store_state_changed.disconnect(receiver)


def three_rules() -> None:
    for name, scope in [("open", "/api/"), ("closed", r"^/users/\d+/$"), ("default", "shop:named")]:
        rule(name, scope, LIMIT, fail_mode=name, algorithm="sliding_window_log")


def compiled(name: str) -> CompiledRule:
    return next(r for r in get_rules().rules if r.name == name)


def timed(client: Any, path: str) -> tuple[int, float, Any]:
    start = time.monotonic()
    response = client.get(path)
    return response.status_code, time.monotonic() - start, response


def evalsha_calls(server: RedisServer) -> int:
    """EVALSHA commands the server has received (run, failed or rejected)."""
    with closing(server.client(socket_timeout=5)) as client:
        stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return sum(stats.get(k, 0) for k in ("calls", "rejected_calls", "failed_calls"))


def warm_up(client: Any) -> None:
    """Rules loaded, script and connection ready, the rejection page rendered once: nothing a
    later request could wait for but the store. (Not on OPEN: a request Redis rejects only
    reads, which a full or read-only server still answers.)"""
    assert [client.get(CLOSED).status_code for _ in range(LIMIT + 1)] == [200] * LIMIT + [429]


def assert_limiting_in_redis(client: Any, redis_client: Any) -> None:
    """Requests are counted in Redis again, in the same counter a direct RedisStore decides on."""
    open_rule = compiled("open")
    key = state_key(open_rule, CLIENT)
    redis_client.delete(key)
    store = RedisStore(redis_client)
    assert client.get(OPEN).status_code == 200
    assert redis_client.ttl(key) > 0  # the request wrote its state in Redis
    # The request above and this decision share one counter: 3 - 2 = 1 left.
    assert store.decide([Check(open_rule, CLIENT)])[0].remaining == LIMIT - 2
    assert [client.get(OPEN).status_code for _ in range(2)] == [200, 429]


# -- an outage: fail modes, local fallback, breaker -----------------------------------------


def test_outage_fail_modes_local_fallback_and_breaker(
    client: Any, fault: Fault, configure: Any, states: list[Any], redis_server: RedisServer
) -> None:
    # Open for the whole test once tripped; the warm-up's rejections not remembered, so the
    # fail-closed rule shows its fail mode (test_blocks.py: what the block cache does then).
    configure(BREAKER_INTERVAL=30, BLOCK_CACHE=False)
    three_rules()
    warm_up(client)
    fault.begin()
    try:
        first = timed(client, OPEN)
        calls = evalsha_calls(redis_server) if fault.answers_info else None
        rest = [timed(client, path) for path in [OPEN] * 3 + [DEFAULT] * 4 + [CLOSED] * 2]
        if fault.answers_info:
            # While the breaker is open, no request reaches Redis.
            assert evalsha_calls(redis_server) == calls
    finally:
        fault.end()

    codes = [first[0]] + [code for code, _, _ in rest]
    # Fail-open rules: admitted, and still limited per process by the local fallback.
    assert codes[:4] == [200, 200, 200, 429]  # open
    assert codes[4:8] == [200, 200, 200, 429]  # default, FAIL_OPEN=True
    assert codes[8:] == [503, 503]  # closed
    for _, _, response in rest[-2:]:
        assert 1 <= int(response["Retry-After"]) <= 30
    # Only the request that found the store broken waited for it.
    if fault.hangs:
        assert TIMEOUT <= first[1] < TIMEOUT * 2 + MARGIN
    assert all(elapsed < TIMEOUT / 2 for _, elapsed, _ in rest), [e for _, e, _ in rest]
    # Told once, with the real error the fault produced.
    assert [available for available, _ in states] == [False]
    assert isinstance(states[0][1], fault.error), states[0][1]


def test_outage_without_local_fallback_admits_fail_open_rules(
    client: Any, fault: Fault, configure: Any, states: list[Any]
) -> None:
    configure(BREAKER_INTERVAL=30, LOCAL_FALLBACK=False, BLOCK_CACHE=False)
    three_rules()
    warm_up(client)
    fault.begin()
    try:
        responses = [timed(client, path) for path in [OPEN] * 5 + [DEFAULT] * 5 + [CLOSED]]
    finally:
        fault.end()
    assert [code for code, _, _ in responses] == [200] * 10 + [503]
    assert int(responses[-1][2]["Retry-After"]) >= 1
    waited = [elapsed >= TIMEOUT for _, elapsed, _ in responses]
    assert waited == [fault.hangs] + [False] * 10
    assert [available for available, _ in states] == [False]


def test_limiting_in_redis_resumes_by_itself_after_the_fault(
    client: Any, fault: Fault, configure: Any, states: list[Any], redis_client: Any
) -> None:
    configure(BREAKER_INTERVAL=RECOVERY_INTERVAL)
    three_rules()
    assert client.get(OPEN).status_code == 200
    fault.begin()
    try:
        assert client.get(OPEN).status_code == 200  # the local fallback admits it
        assert [available for available, _ in states] == [False]
    finally:
        fault.end()
    ended = time.monotonic()
    # No intervention: the next request after BREAKER_INTERVAL probes the store.
    while len(states) < 2:
        assert client.get(OPEN).status_code in (200, 429)
        assert time.monotonic() - ended < RECOVERY_INTERVAL + MARGIN, "not recovered"
        time.sleep(0.02)
    assert [available for available, _ in states] == [False, True]
    assert_limiting_in_redis(client, redis_client)
    assert len(states) == 2  # and no flapping afterwards


def test_paused_server_costs_one_timeout_per_breaker_interval(
    client: Any, configure: Any, states: list[Any], redis_server: RedisServer
) -> None:
    if not redis_server.managed:
        pytest.skip("needs a redis-server the harness runs; unset REDIS_URL")
    configure(BREAKER_INTERVAL=RECOVERY_INTERVAL)
    three_rules()
    warm_up(client)
    redis_server.pause()
    try:
        responses = [timed(client, DEFAULT)]  # trips the breaker
        # Then requests for two more intervals: one probe per interval waits, nobody else.
        tripped = time.monotonic()
        while time.monotonic() - tripped < 2 * RECOVERY_INTERVAL:
            responses.append(timed(client, DEFAULT))
            time.sleep(0.01)
    finally:
        redis_server.resume()
    assert all(code in (200, 429) for code, _, _ in responses)
    assert responses[0][1] >= TIMEOUT
    waits = [i for i, (_, elapsed, _) in enumerate(responses) if elapsed >= TIMEOUT / 2]
    assert waits[0] == 0
    assert len(waits) in (2, 3), waits  # the first request, then one probe per interval
    assert len(responses) > 3 * len(waits)
    assert [available for available, _ in states] == [False]  # re-failed probes: no new signal


# -- faults the store recovers from transparently -------------------------------------------


def test_restart_loses_state_and_reloads_the_script(
    client: Any, configure: Any, states: list[Any], redis_server: RedisServer, redis_client: Any
) -> None:
    if not redis_server.managed:
        pytest.skip("needs a redis-server the harness runs; unset REDIS_URL")
    configure()
    three_rules()
    assert [client.get(OPEN).status_code for _ in range(2)] == [200, 200]
    script_sha = DECIDE_SHA
    redis_server.restart()
    with closing(redis_server.client()) as fresh:
        assert fresh.dbsize() == 0
        assert fresh.script_exists(script_sha) == [False]
        # The state was lost: the client has its whole limit again, counted in Redis.
        assert [client.get(OPEN).status_code for _ in range(4)] == [200, 200, 200, 429]
        assert fresh.script_exists(script_sha) == [True]
        assert fresh.ttl(state_key(compiled("open"), CLIENT)) > 0
    assert states == []  # the pool reconnected and the script was reloaded: no outage


def test_script_flush_reloads_the_script_without_fallback(
    client: Any, configure: Any, states: list[Any], redis_client: Any
) -> None:
    configure()
    three_rules()
    assert [client.get(OPEN).status_code for _ in range(2)] == [200, 200]
    script_sha = DECIDE_SHA
    redis_client.script_flush()
    assert redis_client.script_exists(script_sha) == [False]
    # The counter in Redis goes on: 2 used, 1 left.
    assert [client.get(OPEN).status_code for _ in range(2)] == [200, 429]
    assert redis_client.script_exists(script_sha) == [True]
    assert states == []


@pytest.mark.parametrize(
    "algorithm",
    [
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
        "token_bucket",
        "leaky_bucket",
    ],
)
def test_no_algorithm_writes_past_maxmemory(
    algorithm: str, configure: Any, redis_server: RedisServer, redis_client: Any
) -> None:
    configure()
    # Per day: a window boundary (here, a minute's) must not fall between the decisions.
    rule("r", "/api/", LIMIT, algorithm=algorithm, unit="day")
    store = RedisStore(redis_client)
    check = Check(compiled("r"), CLIENT)
    store.decide([check])  # some state already there
    fault = OutOfMemory(redis_server)
    fault.begin()
    try:
        # Refused as a whole (the fail modes apply), however the script orders its writes.
        with pytest.raises(OutOfMemoryError):
            store.decide([check])
        # A dry run only reads: the store still answers it.
        assert store.decide([check], dry_run=True)[0].remaining == LIMIT - 1
    finally:
        fault.end()
    assert store.decide([check])[0].remaining == LIMIT - 2


# -- key functions that fail, rules that cannot be enforced ----------------------------------


def test_key_function_that_raises_fails_by_the_rule_s_mode(
    client: Any, configure: Any, caplog: Any, states: list[Any]
) -> None:
    configure(KEY_FUNCTIONS={"tenant": "tests.keys.tenant", "broken": "tests.keys.broken"})
    for name, scope in [("open", "/api/"), ("closed", r"^/users/\d+/$"), ("default", "shop:named")]:
        rule(name, scope, 1, fail_mode=name, key_kind="custom", key_arg="broken")
    assert [client.get(OPEN).status_code for _ in range(3)] == [200] * 3
    assert [client.get(DEFAULT).status_code for _ in range(3)] == [200] * 3
    closed = client.get(CLOSED)
    assert closed.status_code == 503
    assert int(closed["Retry-After"]) >= 1
    logged = [
        r
        for r in caplog.records
        if r.levelname == "ERROR" and "could not be computed" in r.getMessage()
    ]
    assert {r.args[0] for r in logged} == {"open", "default", "closed"}
    assert all(isinstance(r.exc_info[1], RuntimeError) for r in logged)
    assert states == []  # the store itself was fine


def test_rule_made_invalid_after_saving_is_skipped_with_one_error(
    client: Any, configure: Any, caplog: Any
) -> None:
    configure()
    rule("per tenant", "/api/", 1, key_kind="custom", key_arg="tenant")
    rule("per ip", "/api/", LIMIT)
    configure(KEY_FUNCTIONS={})  # "tenant" is no longer registered
    codes = []
    for _ in range(LIMIT + 1):
        codes.append(client.get(OPEN, HTTP_X_TENANT="acme").status_code)
        time.sleep(0.25)  # past RULES_REFRESH (0.2 s): the rules are checked again
    # "per tenant" would have rejected the second request; "per ip" is still enforced.
    assert codes == [200] * LIMIT + [429]
    assert client.get("/plain/").status_code == 200
    skipped = [r for r in caplog.records if "cannot be enforced" in r.getMessage()]
    assert len(skipped) == 1
    assert skipped[0].levelname == "ERROR"
    assert skipped[0].args == ("per tenant",)


# -- async ------------------------------------------------------------------------------------


def test_async_outage_fail_modes(
    async_client: Any, configure: Any, states: list[Any], redis_server: RedisServer
) -> None:
    if not redis_server.managed:
        pytest.skip("needs a redis-server the harness runs; unset REDIS_URL")
    configure(BREAKER_INTERVAL=30)
    three_rules()

    async def body() -> list[Any]:
        assert (await async_client.get(CLOSED)).status_code == 200  # redis.asyncio connected
        redis_server.kill()
        try:
            return [await async_client.get(p) for p in [OPEN] * 4 + [DEFAULT, CLOSED]]
        finally:
            redis_server.start()

    responses = run(body)
    assert [r.status_code for r in responses] == [200, 200, 200, 429, 200, 503]
    assert int(responses[-1]["Retry-After"]) >= 1
    assert [available for available, _ in states] == [False]
    assert isinstance(states[0][1], redis.ConnectionError)
