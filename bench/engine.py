"""Benchmark of django_throttle's Redis engine beside its peers (not part of the test suite).

One run starts its own redis-server on a free loopback port (no persistence),
measures latency per decision (each case alternated with a raw EVALSHA of
``return 1`` on the same connection), Redis memory per key, and an 8-process
race, then stops the server. Run it through ``bench/run``; ``--quick`` for a
short run.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: tests/ helpers
pc = time.perf_counter_ns

from tests.engine_helpers import ALGORITHMS  # noqa: E402

HOUR = 3600
MINUTE = 60
DAY = 86400

# Targets from the issue: ratio of the median to a raw EVALSHA, bytes per key, race result.
RATIO_TARGETS = {1: 1.3, 3: 1.6, 5: 2.0}
MEMORY_TARGETS = {
    "fixed_window": 88,
    "token_bucket": 88,
    "leaky_bucket": 88,
    "sliding_window_counter": 176,
}
LOG_BYTES_PER_ENTRY, LOG_BYTES_BASE = 22, 100
MEMORY_ADMITS = 100
RACE_PROCS, RACE_ATTEMPTS, RACE_LIMIT = 8, 40, 50


# -- the server ----------------------------------------------------------------


# -- Django, configured here and nowhere else ------------------------------------


def setup_django(port: int) -> None:
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-not-secret",
        USE_TZ=True,
        ALLOWED_HOSTS=["*"],
        # Only what the peers need: DRF resolves request.user to AnonymousUser.
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "rest_framework"],
        CACHES={
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": f"redis://127.0.0.1:{port}/0",
            }
        },
        REST_FRAMEWORK={
            "DEFAULT_AUTHENTICATION_CLASSES": [],
            "DEFAULT_THROTTLE_RATES": {"anon": "1000/hour", "anonrace": f"{RACE_LIMIT}/hour"},
        },
        # A socket timeout of 1 s, not the default 0.1 s: the cost per call is the same (any
        # timeout makes the socket poll before reading), but a stall of this shared machine
        # must not abort the run.
        DJANGO_THROTTLE={
            "CACHE": "default",
            "BACKEND": "redis",
            "TIMEOUT": 1.0,
            "CONNECT_TIMEOUT": 1.0,
        },
    )
    django.setup()


def identities(n: int) -> list[str]:
    """Distinct IPv4 client addresses (TEST-NET benchmarking range 198.18.0.0/15)."""
    assert n <= 65536
    return [f"198.18.{i // 256}.{i % 256}" for i in range(n)]


_rule_ids = iter(range(1, 1 << 30))


def make_rule(algorithm: str, limit: int, period: int, rule_id: int | None = None) -> Any:
    """A compiled rule as the rule cache builds it (the test suite's helper)."""
    from tests.engine_helpers import make_rule as compiled_rule

    rid = next(_rule_ids) if rule_id is None else rule_id
    return compiled_rule(algorithm, limit, period, rule_id=rid)


# Mixed requests: the rates are loose enough that every benchmark decision admits
# (each client is decided about ~10 times), so the write path is what is measured.
MIX_3 = (
    ("fixed_window", 100, MINUTE),
    ("sliding_window_counter", 1000, HOUR),
    ("token_bucket", 10000, DAY),
)
MIX_5 = (*MIX_3, ("sliding_window_log", 1000, HOUR), ("leaky_bucket", 1000, HOUR))
PEER_RATES_3 = (("100/m", MINUTE, 100), ("1000/h", HOUR, 1000), ("10000/d", DAY, 10000))


# -- what is timed ------------------------------------------------------------------

Op = Callable[[int], Any]


@dataclass
class Case:
    name: str
    op: Op  # one decision about client number i; returns whether it was admitted
    client: Any  # the redis-py client the decision uses: the baseline runs on it
    client_label: str
    rules: int = 0  # ours: number of rules in the request (selects the ratio target)
    ours: bool = False
    samples: list[int] = field(default_factory=list)
    base: list[int] = field(default_factory=list)
    # Ours: the same EVALSHA `return 1` on the path the store's decisions take (its own
    # connections, store/connections.py): the floor of one round trip from this process.
    floor_op: Callable[[], Any] | None = None
    floor: list[int] = field(default_factory=list)
    admitted: int = 0
    decided: int = 0
    profile: dict[str, float] = field(default_factory=dict)


def our_op(store: Any, rules: Sequence[Any], clients: Sequence[str]) -> Op:
    from django_throttle.store import Check, admitted

    n = len(clients)

    def op(i: int) -> bool:
        identity = clients[i % n]
        return admitted(store.decide([Check(rule, identity) for rule in rules]))

    return op


def ratelimit_op(rates: Sequence[tuple[str, str]], requests: Sequence[Any]) -> Op:
    from django_ratelimit.core import is_ratelimited

    n = len(requests)

    def key(group: str, request: Any) -> str:
        return request.META["REMOTE_ADDR"]

    def op(i: int) -> bool:
        request = requests[i % n]
        ok = True
        for group, rate in rates:
            if is_ratelimited(request, group=group, key=key, rate=rate, increment=True):
                ok = False
        return ok

    return op


def drf_op(throttle: Any, requests: Sequence[Any]) -> Op:
    n = len(requests)

    def op(i: int) -> bool:
        return throttle.allow_request(requests[i % n], None)

    return op


def limits_op(limiter: Any, items: Sequence[Any], tag: str, clients: Sequence[str]) -> Op:
    n = len(clients)

    def op(i: int) -> bool:
        identity = clients[i % n]
        ok = True
        for item in items:  # three stacked limits: three hit() calls
            if not limiter.hit(item, tag, identity):
                ok = False
        return ok

    return op


def django_requests(addresses: Sequence[str]) -> list[Any]:
    from django.test import RequestFactory

    factory = RequestFactory()
    return [factory.get("/api/", REMOTE_ADDR=a) for a in addresses]


def drf_requests(addresses: Sequence[str]) -> list[Any]:
    from rest_framework.request import Request
    from rest_framework.test import APIRequestFactory

    factory = APIRequestFactory()
    requests = [Request(factory.get("/api/", REMOTE_ADDR=a)) for a in addresses]
    for r in requests:
        r.user  # noqa: B018 -- resolve AnonymousUser once, as a view would before throttling
    return requests


def build_cases(port: int, n_clients: int) -> list[Case]:
    from django_redis import get_redis_connection
    from limits import parse
    from limits.storage import RedisStorage
    from limits.strategies import (
        FixedWindowRateLimiter,
        MovingWindowRateLimiter,
        SlidingWindowCounterRateLimiter,
    )
    from rest_framework.throttling import AnonRateThrottle

    from django_throttle.store import RedisStore

    # The store as deployed: from_cache builds its own client, with the decision timeouts.
    store = RedisStore.from_cache("default")
    ours = store.client
    ours_label = f"our store's client ({client_settings(ours)})"
    floor_sha = ours.script_load("return 1")

    def floor() -> Any:
        return store.execute("EVALSHA", floor_sha, 0)

    client = get_redis_connection("default")
    client_label = f"django-redis client ({client_settings(client)})"
    addresses = identities(n_clients)
    ids = [f"ip:{a}" for a in addresses]
    cases = []
    for algorithm in ALGORITHMS:
        op = our_op(store, [make_rule(algorithm, 1000, HOUR)], ids)
        cases.append(
            Case(f"ours {algorithm}", op, ours, ours_label, rules=1, ours=True, floor_op=floor)
        )
    for mix in (MIX_3, MIX_5):
        rules = [make_rule(a, limit, period) for a, limit, period in mix]
        op = our_op(store, rules, ids)
        name = f"ours {len(mix)} rules"
        cases.append(Case(name, op, ours, ours_label, rules=len(mix), ours=True, floor_op=floor))

    requests = django_requests(addresses)
    one = [("bench-rl1", "1000/h")]
    three = [(f"bench-rl3-{i}", rate) for i, (rate, _, _) in enumerate(PEER_RATES_3)]
    cases.append(
        Case("django-ratelimit 1 limit", ratelimit_op(one, requests), client, client_label)
    )
    cases.append(
        Case("django-ratelimit 3 limits", ratelimit_op(three, requests), client, client_label)
    )
    cases.append(
        Case(
            "DRF AnonRateThrottle",
            drf_op(AnonRateThrottle(), drf_requests(addresses)),
            client,
            client_label,
        )
    )

    storage = RedisStorage(f"redis://127.0.0.1:{port}")
    limits_client = storage.get_connection()
    limits_label = f"limits' client ({client_settings(limits_client)})"
    one_item = [parse("1000/hour")]
    three_items = [parse(rate) for rate in ("100/minute", "1000/hour", "10000/day")]
    for label, strategy in (
        ("FixedWindow", FixedWindowRateLimiter),
        ("MovingWindow", MovingWindowRateLimiter),
        ("SlidingWindowCounter", SlidingWindowCounterRateLimiter),
    ):
        limiter = strategy(storage)
        for count, items in ((1, one_item), (3, three_items)):
            op = limits_op(limiter, items, f"{label}{count}", addresses)
            name = f"limits {label} {count} limit{'s' if count > 1 else ''}"
            cases.append(Case(name, op, limits_client, limits_label))
    return cases


def client_settings(client: Any) -> str:
    """The settings of a client that change the cost of a round trip."""
    kwargs = client.connection_pool.connection_kwargs
    timeout = kwargs.get("socket_timeout")
    return f"socket timeout {timeout if timeout is None else f'{timeout:g} s'}"


def baseline(client: Any) -> Callable[[], Any]:
    sha = client.script_load("return 1")

    def raw() -> Any:
        return client.evalsha(sha, 0)

    return raw


def run_timings(cases: Sequence[Case], rounds: int, per_round: int, warmup: int) -> None:
    """Rounds outside, cases inside, each decision alternated with a raw EVALSHA."""
    raws = {id(c.client): baseline(c.client) for c in cases}
    counters = dict.fromkeys((c.name for c in cases), 0)
    for case in cases:
        raw = raws[id(case.client)]
        for i in range(warmup):  # every client gets state before timing starts
            case.op(i)
            raw()
        counters[case.name] = warmup
    gc.collect()
    for _ in range(rounds):
        for case in cases:
            raw, op = raws[id(case.client)], case.op
            samples, base = case.samples, case.base
            k = counters[case.name]
            admitted = 0
            for j in range(per_round):
                # Alternate which goes first, so neither always follows the other.
                if j & 1:
                    t0 = pc()
                    raw()
                    t1 = pc()
                    ok = op(k + j)
                    t2 = pc()
                    base.append(t1 - t0)
                    samples.append(t2 - t1)
                else:
                    t0 = pc()
                    ok = op(k + j)
                    t1 = pc()
                    raw()
                    t2 = pc()
                    samples.append(t1 - t0)
                    base.append(t2 - t1)
                admitted += bool(ok)
                if case.floor_op is not None:
                    t0 = pc()
                    case.floor_op()
                    case.floor.append(pc() - t0)
            counters[case.name] = k + per_round
            case.admitted += admitted
            case.decided += per_round


# -- where the time goes --------------------------------------------------------------


@contextlib.contextmanager
def counting_commands() -> Iterator[dict[str, int]]:
    """Count round trips and top-level command names sent by redis-py while inside (through
    Redis.execute_command, which calls send_command, or a Connection used directly, as the
    store's own connections do, which packs with pack_command)."""
    from redis.connection import AbstractConnection

    counts: dict[str, int] = {"round_trips": 0}
    originals = {
        name: getattr(AbstractConnection, name)
        for name in ("send_packed_command", "send_command", "pack_command")
    }

    def name_of(args: Sequence[Any]) -> None:
        name = f"cmd:{str(args[0]).lower()}"
        counts[name] = counts.get(name, 0) + 1

    def packed(self: Any, command: Any, check_health: bool = True) -> None:
        counts["round_trips"] += 1
        originals["send_packed_command"](self, command, check_health)

    def command(self: Any, *args: Any, **kwargs: Any) -> None:
        name_of(args)
        originals["send_command"](self, *args, **kwargs)

    def pack(self: Any, *args: Any) -> Any:
        name_of(args)
        return originals["pack_command"](self, *args)

    AbstractConnection.send_packed_command = packed  # type: ignore[method-assign]
    AbstractConnection.send_command = command  # type: ignore[method-assign]
    AbstractConnection.pack_command = pack  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(AbstractConnection, name, original)


def profile_pass(admin: Any, op: Callable[[], Any], n: int) -> dict[str, float]:
    """Client CPU, server time (INFO commandstats) and round trips per call, over n calls."""
    admin.config_resetstat()
    with counting_commands() as counts:
        cpu0, wall0 = time.process_time_ns(), pc()
        for _ in range(n):
            op()
        cpu1, wall1 = time.process_time_ns(), pc()
    stats = admin.info("commandstats")
    top_level = {k[4:] for k in counts if k.startswith("cmd:")}
    # Commands run from scripts are counted by commandstats too; sum only the ones the
    # client sent (none of the cases here sends a command its scripts also run).
    server_us = sum(v["usec"] for k, v in stats.items() if k.split("_", 1)[1] in top_level)
    return {
        "wall_us": (wall1 - wall0) / n / 1000,
        "cpu_us": (cpu1 - cpu0) / n / 1000,
        "server_us": server_us / n,
        "round_trips": counts["round_trips"] / n,
    }


def profile_cases(cases: Sequence[Case], admin: Any, n: int) -> dict[str, dict[str, float]]:
    raws = {id(c.client): baseline(c.client) for c in cases}
    out = {}
    base_done: set[int] = set()
    for case in cases:
        counter = iter(range(10**9, 2 * 10**9))
        case.profile = profile_pass(admin, lambda op=case.op, c=counter: op(next(c)), n)
        if id(case.client) not in base_done:
            base_done.add(id(case.client))
            out[case.client_label] = profile_pass(admin, raws[id(case.client)], n)
    return out


class StubClient:
    """Stands in for redis-py: returns a canned decide.lua reply, so only our Python is timed."""

    connection_pool = None  # no pool: the store sends its commands through execute_command

    def __init__(self, n_checks: int) -> None:
        self.reply = [1_764_000_000_000_000, 1] + [1, 999, 3_600_000_000, 0, 0] * n_checks

    def execute_command(self, *args: Any) -> list[int]:
        return self.reply


def best_us(fn: Callable[[int], Any], n: int, repeat: int = 5) -> float:
    best = math.inf
    for _ in range(repeat):
        t0 = pc()
        for i in range(n):
            fn(i)
        best = min(best, (pc() - t0) / n / 1000)
    return best


def python_side(n: int, n_clients: int) -> list[tuple[str, float]]:
    """Microseconds of our own Python per decision, with no redis-py and no network."""
    from django_throttle.store import Check, RedisStore, digest
    from django_throttle.store.redis import parse_reply

    ids = [f"ip:{a}" for a in identities(n_clients)]
    m = len(ids)
    rows = []
    for label, mix in (
        ("1 rule (fixed_window)", (("fixed_window", 1000, HOUR),)),
        ("3 rules", MIX_3),
        ("5 rules", MIX_5),
    ):
        rules = [make_rule(a, limit, period) for a, limit, period in mix]
        store = RedisStore(StubClient(len(rules)))
        us = best_us(lambda i, s=store, r=rules: s.decide([Check(x, ids[i % m]) for x in r]), n)
        rows.append((f"RedisStore.decide, {label}", us))
    rule = make_rule("fixed_window", 1000, HOUR)
    rows.append(("  of which digest() of one identity", best_us(lambda i: digest(ids[i % m]), n)))
    rows.append(("  of which Check() of one rule", best_us(lambda i: Check(rule, ids[i % m]), n)))
    checks = [Check(rule, ids[0])]
    reply = StubClient(1).reply
    rows.append(
        ("  of which parse_reply(), 1 rule", best_us(lambda i: parse_reply(checks, reply), n))
    )
    return rows


def packing_costs(client: Any, n: int) -> list[tuple[str, float]]:
    """What redis-py spends packing the EVALSHA of 1 and 5 rules against the bare baseline."""
    conn = client.connection_pool.get_connection()
    try:
        sha = "0" * 40
        rows = [
            (
                "redis-py pack EVALSHA sha 0",
                best_us(lambda i: conn.pack_command("EVALSHA", sha, 0), n),
            )
        ]
        for count in (1, 5):
            keys = [f"{{thr}}{k}f:AAAAAAAAAAAA" for k in range(count)]
            args: list[Any] = ["0"]
            for _ in range(count):
                args += ("f", 1000, 3600, 1000, 1, "1")
            rows.append(
                (
                    f"redis-py pack EVALSHA, {count} rule{'s' if count > 1 else ''}",
                    best_us(
                        lambda i, k=keys, a=args: conn.pack_command("EVALSHA", sha, len(k), *k, *a),
                        n,
                    ),
                )
            )
    finally:
        client.connection_pool.release(conn)
    return rows


def layer_steps(
    client: Any,
    store: Any,
    sha: str,
    rules: Sequence[Any],
    ids: Sequence[str],
    inputs: Sequence[tuple[list[str], list[Any]]],
) -> dict[str, Callable[[int], Any]]:
    from django_throttle.store import Check
    from django_throttle.store.redis import DECIDE_SOURCE

    m = len(ids)
    decide_sha = client.script_load(DECIDE_SOURCE)
    execute = store.execute  # the store's own connections (store/connections.py)

    def raw(i: int) -> Any:
        return client.evalsha(sha, 0)

    def floor(i: int) -> Any:
        return execute("EVALSHA", sha, 0)

    def server(i: int) -> Any:
        keys, args = inputs[i % m]
        return execute("EVALSHA", decide_sha, len(keys), *keys, *args)

    def ours(i: int) -> Any:
        identity = ids[i % m]
        return store.decide([Check(rule, identity) for rule in rules])

    return {
        "raw EVALSHA `return 1` through redis-py's Redis.evalsha": raw,
        "EVALSHA `return 1` on the store's connections": floor,
        "+ decide.lua on the server (prebuilt args, store's connections)": server,
        "+ our Python: RedisStore.decide([Check...])": ours,
    }


def decomposition(client: Any, n: int, n_clients: int) -> list[tuple[str, str, float, float]]:
    """Our decision taken apart in place, one layer per step, the steps interleaved per call.

    First redis-py's bare round trip, for reference; then, one layer added per step: the
    bare round trip on the store's own connections, decide.lua's work on the server (same
    keys and arguments, prebuilt), and our Python (keys, arguments, Check and Result
    objects). Medians of wall time and of this thread's CPU time, in microseconds.
    """
    from django_throttle.store import Check, RedisStore
    from django_throttle.store.redis import script_input

    tt = time.thread_time_ns
    store = RedisStore(client)
    sha = client.script_load("return 1")
    ids = [f"ip:{a}" for a in identities(n_clients)]
    m = len(ids)
    rows = []
    for label, mix in (("1 rule", (("fixed_window", 100_000, HOUR),)), ("5 rules", MIX_5)):
        rules = [make_rule(a, limit * 100, period) for a, limit, period in mix]
        inputs = [script_input([Check(r, i) for r in rules], False) for i in ids]
        steps = layer_steps(client, store, sha, rules, ids, inputs)
        wall: dict[str, list[int]] = {k: [] for k in steps}
        cpu: dict[str, list[int]] = {k: [] for k in steps}
        for i in range(m):  # warm up: every key exists
            for f in steps.values():
                f(i)
        order = list(steps.items())
        for i in range(n):
            start = i % len(order)  # rotate, so no step always follows the same one
            for k, f in order[start:] + order[:start]:
                c0, w0 = tt(), pc()
                f(i)
                w1, c1 = pc(), tt()
                wall[k].append(w1 - w0)
                cpu[k].append(c1 - c0)
        for k in steps:
            rows.append((label, k, median(wall[k]) / 1000, median(cpu[k]) / 1000))
    return rows


SERVER_SCRIPTS = {
    "return 1": "return 1",
    "TIME": "redis.call('TIME') return 1",
    # The least any fixed window needs: the clock, a read, a write with expiry.
    "TIME + GET + SET PX": (
        "redis.call('TIME') redis.call('GET', KEYS[1]) "
        "redis.call('SET', KEYS[1], '1:1', 'PX', 3600000) return 1"
    ),
}


def server_breakdown(admin: Any, n: int) -> list[tuple[str, float]]:
    """Server time per call (INFO commandstats) of decide.lua beside minimal scripts."""
    from importlib import resources

    source = resources.files("django_throttle.store").joinpath("lua", "decide.lua").read_text()
    scripts = dict(SERVER_SCRIPTS)
    # decide.lua up to its main loop: the clock and the definitions it builds on every call.
    marker = "local admitted = true"
    if marker in source:
        scripts["decide.lua up to its main loop (TIME + definitions)"] = (
            source[: source.index(marker)] + "return 1"
        )
    one = ("f", 100_000, HOUR, 100_000, 1, "1")
    calls: list[tuple[str, str, int, tuple[Any, ...]]] = [
        (name, body, 1, one) for name, body in scripts.items()
    ]
    calls.append(("decide.lua, 1 rule (fixed_window)", source, 1, one))
    calls.append(
        (
            "decide.lua, 1 rule (sliding_window_log)",
            source,
            1,
            ("l", 100_000, HOUR, 100_000, 1, "1"),
        )
    )
    five: tuple[Any, ...] = ()
    for code in "flctb":
        five += (code, 100_000, HOUR, 100_000, 1, "1")
    calls.append(("decide.lua, 5 rules (one of each algorithm)", source, 5, five))
    rows = []
    for index, (name, body, nkeys, args) in enumerate(calls):
        sha = admin.script_load(body)
        codes = "flctb" if nkeys == 5 else str(args[0])
        keys = [f"{{bench}}s{index}{c}:" for c in codes]

        def call(i: int, sha: str = sha, keys: list[str] = keys, args: tuple = args) -> None:
            admin.evalsha(sha, len(keys), *(k + str(i % 100) for k in keys), "0", *args)

        for i in range(200):
            call(i)
        best = math.inf
        for _ in range(3):  # the least disturbed of three batches
            admin.config_resetstat()
            for i in range(n):
                call(i)
            best = min(best, admin.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
        rows.append((name, best))
    return rows


# -- memory ----------------------------------------------------------------------------


def memory_usage(admin: Any, run: Callable[[], Any]) -> tuple[int, int, int]:
    """(total MEMORY USAGE, key count, longest key) of what run() leaves in an empty db."""
    admin.flushall()
    run()
    keys = list(admin.scan_iter(count=1000))
    total = sum(admin.memory_usage(k, samples=0) or 0 for k in keys)
    return total, len(keys), max((len(k) for k in keys), default=0)


@dataclass
class MemRow:
    name: str
    admits: int
    total: int
    keys: int
    key_len: int
    target: int | None = None
    per_entry: float | None = None


def measure_memory(port: int, admin: Any) -> list[MemRow]:
    from django_ratelimit.core import is_ratelimited
    from limits import parse
    from limits.storage import RedisStorage
    from limits.strategies import (
        FixedWindowRateLimiter,
        MovingWindowRateLimiter,
        SlidingWindowCounterRateLimiter,
    )
    from rest_framework.throttling import AnonRateThrottle

    from django_throttle.store import Check, RedisStore

    store = RedisStore.from_cache("default")
    address = "198.51.100.7"
    identity = f"ip:{address}"
    rows: list[MemRow] = []

    def ours(algorithm: str, admits: int) -> tuple[int, int, int]:
        # Rule id 1: the shortest key a deployment has ("{thr}1f:" + 12 characters of digest).
        rule = make_rule(algorithm, max(1000, 10 * admits), HOUR, rule_id=1)

        def run() -> None:
            for _ in range(admits):
                assert store.decide([Check(rule, identity)])[0].allowed

        return memory_usage(admin, run)

    for algorithm in ALGORITHMS:
        total, keys, key_len = ours(algorithm, MEMORY_ADMITS)
        if algorithm == "sliding_window_log":
            one = ours(algorithm, 1)[0]
            target = LOG_BYTES_PER_ENTRY * MEMORY_ADMITS + LOG_BYTES_BASE
            per = (total - one) / (MEMORY_ADMITS - 1)
            rows.append(
                MemRow(f"ours {algorithm}", MEMORY_ADMITS, total, keys, key_len, target, per)
            )
            big, bkeys, blen = ours(algorithm, 1000)
            rows.append(
                MemRow(f"ours {algorithm}", 1000, big, bkeys, blen, None, (big - one) / 999)
            )
        else:
            rows.append(
                MemRow(
                    f"ours {algorithm}",
                    MEMORY_ADMITS,
                    total,
                    keys,
                    key_len,
                    MEMORY_TARGETS[algorithm],
                )
            )

    storage = RedisStorage(f"redis://127.0.0.1:{port}")
    for label, strategy in (
        ("FixedWindow", FixedWindowRateLimiter),
        ("MovingWindow", MovingWindowRateLimiter),
        ("SlidingWindowCounter", SlidingWindowCounterRateLimiter),
    ):
        limiter = strategy(storage)

        def hits(n: int, limiter: Any = limiter) -> Callable[[], None]:
            item = parse(f"{max(1000, 10 * n)}/hour")
            return lambda: [limiter.hit(item, address) for _ in range(n)]

        total, keys, key_len = memory_usage(admin, hits(MEMORY_ADMITS))
        per = None
        if label == "MovingWindow":
            one = memory_usage(admin, hits(1))[0]
            per = (total - one) / (MEMORY_ADMITS - 1)
            rows.append(MemRow(f"limits {label}", MEMORY_ADMITS, total, keys, key_len, None, per))
            big, bkeys, blen = memory_usage(admin, hits(1000))
            rows.append(MemRow(f"limits {label}", 1000, big, bkeys, blen, None, (big - one) / 999))
        else:
            rows.append(MemRow(f"limits {label}", MEMORY_ADMITS, total, keys, key_len))

    (request,) = django_requests([address])

    def ratelimit() -> None:
        for _ in range(MEMORY_ADMITS):
            is_ratelimited(request, group="mem", key="ip", rate="1000/h", increment=True)

    rows.append(MemRow("django-ratelimit", MEMORY_ADMITS, *memory_usage(admin, ratelimit)))

    (drf_request,) = drf_requests([address])
    throttle = AnonRateThrottle()

    def drf() -> None:
        for _ in range(MEMORY_ADMITS):
            assert throttle.allow_request(drf_request, None)

    rows.append(MemRow("DRF AnonRateThrottle", MEMORY_ADMITS, *memory_usage(admin, drf)))
    admin.flushall()
    return rows


# -- the race ------------------------------------------------------------------------------

RACE_CONTENDERS = (
    *(f"ours {a}" for a in ALGORITHMS),
    "ours 5 rules",
    "django-ratelimit",
    "DRF AnonRateThrottle",
    "limits FixedWindow",
    "limits MovingWindow",
    "limits SlidingWindowCounter",
)


def race_op(name: str, port: int, tag: str, address: str, index: int) -> Callable[[], bool]:
    """One contender's attempt, built in the racing process on its own connections."""
    if name.startswith("ours"):
        from django_throttle.store import Check, RedisStore, admitted

        # A fresh connection pool per process (spawned), so each has its own connection.
        store = RedisStore.from_cache("default")
        store.client.ping()
        base = 10_000 + 10 * index
        if name == "ours 5 rules":
            # Every rule at the race limit: all-or-nothing must still admit exactly that many.
            rules = [
                make_rule(a, RACE_LIMIT, HOUR, rule_id=base + i) for i, a in enumerate(ALGORITHMS)
            ]
        else:
            rules = [make_rule(name.split(" ", 1)[1], RACE_LIMIT, HOUR, rule_id=base)]
        identity = f"ip:{address}"
        return lambda: admitted(store.decide([Check(r, identity) for r in rules]))
    if name == "django-ratelimit":
        from django_ratelimit.core import is_ratelimited
        from django_redis import get_redis_connection

        get_redis_connection("default").ping()
        (request,) = django_requests([address])
        group = f"race-{tag}"
        return lambda: (
            not is_ratelimited(
                request, group=group, key="ip", rate=f"{RACE_LIMIT}/h", increment=True
            )
        )
    if name == "DRF AnonRateThrottle":
        from django_redis import get_redis_connection
        from rest_framework.throttling import AnonRateThrottle

        get_redis_connection("default").ping()

        class RaceThrottle(AnonRateThrottle):
            scope = "anonrace"

        throttle = RaceThrottle()
        (request,) = drf_requests([address])
        return lambda: throttle.allow_request(request, None)
    from limits import parse, strategies
    from limits.storage import RedisStorage

    storage = RedisStorage(f"redis://127.0.0.1:{port}")
    storage.get_connection().ping()
    limiter = getattr(strategies, name.split(" ", 1)[1] + "RateLimiter")(storage)
    item = parse(f"{RACE_LIMIT}/hour")
    return lambda: limiter.hit(item, tag, address)


def race_worker(port: int, tag: str, address: str, barrier: Any, results: Any) -> None:
    setup_django(port)
    for index, name in enumerate(RACE_CONTENDERS):
        try:
            attempt = race_op(name, port, f"{tag}-{index}", address, index)
        except Exception as exc:  # reported, and the other processes are not left waiting
            attempt, error = None, exc
        barrier.wait(timeout=60)  # everyone connected and ready: go together
        try:
            if attempt is None:
                raise error
            admitted = sum(bool(attempt()) for _ in range(RACE_ATTEMPTS))
        except Exception as exc:
            results.put((name, 0, f"{type(exc).__name__}: {exc}"))
        else:
            results.put((name, admitted, None))


def race_address() -> str:
    """A client whose django-ratelimit window (jittered per key) does not end during the race."""
    from django_ratelimit.core import _get_window

    for i in range(1, 250):
        address = f"203.0.113.{i}"
        if _get_window(address, HOUR) - time.time() > 120:
            return address
    raise RuntimeError("no address found with a window far from its end")


def run_race(port: int) -> dict[str, int | None]:
    # Our windows are aligned to the hour: do not race across a boundary.
    left = HOUR - time.time() % HOUR
    if left < 30:
        print(f"(waiting {left:.0f} s for the top of the hour before the race)", flush=True)
        time.sleep(left + 1)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(RACE_PROCS)
    results = ctx.Queue()
    tag = uuid.uuid4().hex[:8]
    address = race_address()
    procs = [
        ctx.Process(target=race_worker, args=(port, tag, address, barrier, results), daemon=True)
        for _ in range(RACE_PROCS)
    ]
    for p in procs:
        p.start()
    totals = dict.fromkeys(RACE_CONTENDERS, 0)
    failed: set[str] = set()
    try:
        for _ in range(RACE_PROCS * len(RACE_CONTENDERS)):
            name, admitted, error = results.get(timeout=120)
            if error:
                print(f"race {name}: {error}", file=sys.stderr)
                failed.add(name)
            totals[name] += admitted
    finally:
        # Done: the workers are exiting. Interrupted: stop them now, not after a wait.
        deadline = time.monotonic() + 10
        for p in procs:
            if sys.exc_info()[0] is None:
                p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(5)
    return {name: None if name in failed else n for name, n in totals.items()}


# -- report -------------------------------------------------------------------------------


def median(values: Sequence[int]) -> float:
    s = sorted(values)
    n = len(s)
    return (s[n // 2] + s[(n - 1) // 2]) / 2


def p99(values: Sequence[int]) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    right = [i > 0 and all(_numeric(r[i]) for r in cells[1:]) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.rjust(w) if right[i] else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
            + " |"
        )

    sep = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if right[i] else ("-" * (w + 2)) for i, w in enumerate(widths)
        )
        + "|"
    )
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def _numeric(text: str) -> bool:
    return text.replace(".", "", 1).replace("x", "").replace("-", "").strip().isdigit() or text in (
        "",
        "-",
    )


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine(admin: Any) -> dict[str, str]:
    import redis.utils

    return {
        "django_throttle tree": _tree(),
        "nproc": str(os.cpu_count()),
        "load average at start (1, 5, 15 min)": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "cpu": _cpu_model(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "redis-server": admin.info("server")["redis_version"],
        "redis-py": version("redis"),
        "hiredis": f"{version('hiredis')} (used: {redis.utils.HIREDIS_AVAILABLE})",
        "Django": version("Django"),
        "django-redis": version("django-redis"),
        "django-ratelimit": version("django-ratelimit"),
        "djangorestframework": version("djangorestframework"),
        "limits": version("limits"),
    }


def _tree() -> str:
    """The commit measured, and whether django_throttle/ had uncommitted changes."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", root, *args], capture_output=True, text=True, check=False
        ).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "django_throttle")
    return f"{head}{' + uncommitted changes in django_throttle/' if dirty else ''}"


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report(
    info: dict[str, str],
    args: argparse.Namespace,
    cases: Sequence[Case],
    base_profiles: dict[str, dict[str, float]],
    py_rows: list[tuple[str, float]],
    layers: list[tuple[str, str, float, float]],
    server_rows: list[tuple[str, float]],
    memory: list[MemRow],
    race: dict[str, int | None] | None,
    elapsed: float,
) -> dict[str, Any]:
    print("\n## Machine\n")
    print(table(("", ""), list(info.items())))

    print(
        f"\n## Latency per decision ({args.rounds} rounds x {args.per_round} decisions per case, "
        f"{args.clients} clients, each decision alternated with a raw redis-py EVALSHA of "
        "`return 1` on the same client; ours also with the same EVALSHA on the store's own "
        "connections, the floor of one round trip)\n"
    )
    rows = []
    out_cases = []
    for c in cases:
        med, tail = median(c.samples) / 1000, p99(c.samples) / 1000
        bmed, btail = median(c.base) / 1000, p99(c.base) / 1000
        ratio = med / bmed
        fmed = median(c.floor) / 1000 if c.floor else None
        target = RATIO_TARGETS.get(c.rules) if c.ours else None
        rows.append(
            (
                c.name,
                f"{med:.1f}",
                f"{tail:.1f}",
                f"{bmed:.1f}",
                f"{btail:.1f}",
                f"{ratio:.2f}x",
                f"<= {target}x" if target else "-",
                verdict(ratio <= target) if target else "-",
                f"{fmed:.1f}" if fmed else "-",
                f"{med / fmed:.2f}x" if fmed else "-",
                f"{c.admitted}/{c.decided}",
            )
        )
        out_cases.append(
            {
                "name": c.name,
                "median_us": med,
                "p99_us": tail,
                "evalsha_median_us": bmed,
                "evalsha_p99_us": btail,
                "ratio": ratio,
                "target": target,
                "store_path_evalsha_median_us": fmed,
                "admitted": c.admitted,
                "decided": c.decided,
                "profile": c.profile,
            }
        )
    print(
        table(
            (
                "case",
                "median us",
                "p99 us",
                "EVALSHA median us",
                "EVALSHA p99 us",
                "ratio",
                "target",
                "",
                "store-path EVALSHA median us",
                "ratio to it",
                "admitted",
            ),
            rows,
        )
    )

    print(
        f"\n## Where the time goes ({min(args.per_round, 1000)} consecutive decisions per case; client CPU is "
        "this process's CPU time, server time is INFO commandstats of the commands sent)\n"
    )
    rows = []
    for label, p in base_profiles.items():
        rows.append((f"raw EVALSHA `return 1` on {label}", *_profile_cells(p)))
    rows += [(c.name, *_profile_cells(c.profile)) for c in cases]
    print(table(("case", "wall us", "client CPU us", "server us", "round trips"), rows))

    print(
        "\n## Our decision taken apart, in place (each step adds one layer; steps interleaved "
        "per call; medians)\n"
    )
    rows = [(label, step, f"{w:.1f}", f"{c:.1f}") for label, step, w, c in layers]
    print(table(("request", "step", "wall us", "thread CPU us"), rows))

    print(
        "\n## Server time per call of decide.lua beside minimal scripts "
        "(INFO commandstats usec_per_call, best of 3 batches)\n"
    )
    print(table(("script", "server us"), [(w, f"{us:.1f}") for w, us in server_rows]))

    print(
        "\n## Our Python per decision in a hot loop, without redis-py or the network "
        "(stubbed client)\n"
    )
    print(table(("what", "us"), [(w, f"{us:.2f}") for w, us in py_rows]))

    print(f"\n## Redis MEMORY USAGE after {MEMORY_ADMITS} admits of one client (SAMPLES 0)\n")
    rows = []
    for m in memory:
        ok = m.target is None or m.total <= m.target
        rows.append(
            (
                m.name,
                m.admits,
                m.keys,
                m.key_len,
                m.total,
                f"{m.per_entry:.1f}" if m.per_entry is not None else "-",
                f"<= {m.target}" if m.target is not None else "-",
                verdict(ok) if m.target is not None else "-",
            )
        )
    print(
        table(
            ("store", "admits", "keys", "key length", "bytes", "bytes per entry", "target", ""),
            rows,
        )
    )
    out: dict[str, Any] = {
        "machine": info,
        "options": vars(args),
        "cases": out_cases,
        "evalsha_profiles": base_profiles,
        "python_side_us": dict(py_rows),
        "server_us": dict(server_rows),
        "decomposition": [
            {"request": a, "step": b, "wall_us": w, "cpu_us": c} for a, b, w, c in layers
        ],
        "memory": [vars(m) for m in memory],
    }
    if race is not None:
        print(
            f"\n## Race: {RACE_PROCS} processes (spawned, own connections, released by a barrier), "
            f"{RACE_ATTEMPTS} attempts each, limit {RACE_LIMIT}/hour, one client\n"
        )
        rows = []
        for name, admitted in race.items():
            ours = name.startswith("ours")
            rows.append(
                (
                    name,
                    "error" if admitted is None else f"{admitted}/{RACE_PROCS * RACE_ATTEMPTS}",
                    f"exactly {RACE_LIMIT}" if ours else "-",
                    race_verdict(admitted, ours),
                )
            )
        print(table(("contender", "admitted", "target", ""), rows))
        out["race"] = race
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nTotal run time: {elapsed:.0f} s; load average at the end: {load}")
    out["elapsed_s"] = elapsed
    return out


def race_verdict(admitted: int | None, ours: bool) -> str:
    if admitted is None:
        return "error"
    if ours:
        return verdict(admitted == RACE_LIMIT)
    if admitted == RACE_LIMIT:
        return "exact"
    return f"{'over' if admitted > RACE_LIMIT else 'under'} by {abs(admitted - RACE_LIMIT)}"


def _profile_cells(p: dict[str, float]) -> tuple[str, ...]:
    return (
        f"{p['wall_us']:.1f}",
        f"{p['cpu_us']:.1f}",
        f"{p['server_us']:.1f}",
        f"{p['round_trips']:.0f}",
    )


# -- main ----------------------------------------------------------------------------------


class Timeout(Exception):
    pass


def _on_signal(signum: int, frame: Any) -> None:
    if signum == signal.SIGALRM:
        raise Timeout("the benchmark ran past its time limit")
    raise SystemExit(128 + signum)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a few seconds)")
    parser.add_argument("--rounds", type=int, help="rounds over every case (default 5, quick 2)")
    parser.add_argument(
        "--per-round", type=int, help="decisions per case and round (default 2000, quick 300)"
    )
    parser.add_argument(
        "--clients", type=int, help="distinct client identities (default 1000, quick 200)"
    )
    parser.add_argument("--no-race", action="store_true", help="skip the multi-process race")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument(
        "--time-limit", type=int, default=290, help="abort after this many seconds (default 290)"
    )
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.per_round = args.per_round or (300 if args.quick else 2000)
    args.clients = args.clients or (200 if args.quick else 1000)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
        signal.signal(signum, _on_signal)
    signal.alarm(args.time_limit)
    if shutil.which("redis-server") is None:
        print("redis-server is not on PATH", file=sys.stderr)
        return 2
    started = time.monotonic()
    from tests.redis_server import RedisServer  # the test harness's: free loopback port, no RDB/AOF

    server = RedisServer()
    try:
        server.start()
        print(f"redis-server started on 127.0.0.1:{server.port} (no persistence)", flush=True)
        setup_django(server.port)
        import redis

        admin = redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True)
        info = machine(admin)
        cases = build_cases(server.port, args.clients)
        print(f"timing {len(cases)} cases...", flush=True)
        run_timings(cases, args.rounds, args.per_round, warmup=args.clients)
        print("profiling...", flush=True)
        base_profiles = profile_cases(cases, admin, min(args.per_round, 1000))
        try:
            py_rows = python_side(20_000 if not args.quick else 3000, args.clients)
        except (ImportError, AttributeError) as exc:
            print(f"Python-side timings skipped: {exc!r}", file=sys.stderr)
            py_rows = []
        py_rows += packing_costs(cases[0].client, 20_000 if not args.quick else 3000)
        try:
            layers = decomposition(cases[0].client, 300 if args.quick else 2000, args.clients)
        except (ImportError, AttributeError) as exc:  # the engine's internals moved
            print(f"decomposition skipped: {exc!r}", file=sys.stderr)
            layers = []
        server_rows = server_breakdown(admin, 500 if args.quick else 2000)
        print("measuring memory...", flush=True)
        memory = measure_memory(server.port, admin)
        race = None
        if not args.no_race:
            print(f"racing {RACE_PROCS} processes...", flush=True)
            race = run_race(server.port)
        out = report(
            info,
            args,
            cases,
            base_profiles,
            py_rows,
            layers,
            server_rows,
            memory,
            race,
            time.monotonic() - started,
        )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
    except Timeout as exc:
        print(f"aborted: {exc}", file=sys.stderr)
        return 3
    finally:
        signal.alarm(0)
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
