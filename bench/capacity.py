"""Decisions per second one redis-server core sustains, 16 clients at a time, and what that
makes of a cluster of N masters (docs/benchmarks.md, "Capacity per Redis core")."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import Counter
from typing import Any

import harness
from script import ALGORITHMS, Case, Rules, command, decide_case, measure

from tests import redis_topology
from tests.traffic import wait_until

CONNECTIONS = 16  # web processes, each waiting for its reply before it sends again
IDENTITIES = 10_000  # distinct clients the load goes round
MASTERS = (1, 3, 6, 12, 24)
SPREAD_IDENTITIES = 100_000  # half addresses, half user ids
SPREAD_RULES = 3
SLOTS = 16384
SATURATED = 0.9  # server CPU share from which the core counts as kept busy

# The commands of rate-limiter-flexible's RateLimiterRedis script (lib/RateLimiterRedis.js):
# SET NX EX (a new key at 0 with its expiry), INCRBY, PTTL; its TTL repair (EXPIRE when a
# key has none) never runs here. ARGV: points, duration (s).
FLEXIBLE_INCR_TTL = """
redis.call('SET', KEYS[1], 0, 'EX', ARGV[2], 'NX')
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
return {n, redis.call('PTTL', KEYS[1])}
"""


def limits_source() -> str:
    """limits' FixedWindow script (INCRBY, then EXPIRE when the key is new), read from the
    installed package (bench/requirements.txt)."""
    from importlib.resources import files

    path = files("limits.resources.redis.lua_scripts").joinpath("incr_expire.lua")
    return path.read_text()


def reference_cases(admin: Any, addrs: list[str]) -> list[Case]:
    print(f"limits' script: incr_expire.lua of limits {harness.version('limits')}")
    limits, flexible = admin.script_load(limits_source()), admin.script_load(FLEXIBLE_INCR_TTL)
    limits_keys = [f"LIMITS:LIMITER/ip:{a}/1000000000/1/hour" for a in addrs]  # 10^9 an hour
    # Envoy's ratelimit (src/redis/fixed_cache_impl.go): INCRBY and EXPIRE per descriptor,
    # pipelined, no script; its key: domain, descriptor and the window's start.
    envoy = [f"domain_ip_{a}_1733097600" for a in addrs]
    return [
        Case("`return 1`", [command("EVALSHA", admin.script_load("return 1"), 0)]),
        Case(  # limits' ARGV: expiry, amount
            "limits FixedWindow `hit()`'s script",
            [command("EVALSHA", limits, 1, key, 3600, 1) for key in limits_keys],
        ),
        Case(
            "rate-limiter-flexible RateLimiterRedis's commands",
            [command("EVALSHA", flexible, 1, f"rlflx:ip:{a}", 1, 3600) for a in addrs],
        ),
        Case(
            "Envoy ratelimit's commands (INCRBY + EXPIRE, pipelined)",
            [command("INCRBY", k, 1) + command("EXPIRE", k, 3600) for k in envoy],
            counted=("incrby", "expire"),
        ),
    ]


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """The slots ``redis-cli --cluster create`` gives each of ``masters`` masters (its
    clusterManagerCommandCreate: even contiguous ranges, rounded, the last to 16383)."""
    per = SLOTS / masters
    ranges, first, cursor = [], 0, 0.0
    for i in range(masters):
        last = math.floor(cursor + per - 1 + 0.5)
        if last > SLOTS or i == masters - 1:
            last = SLOTS - 1
        last = max(last, first)
        ranges.append((first, last))
        first, cursor = last + 1, cursor + per
    return ranges


def key_spread() -> tuple[Counter[int], int]:
    """Decisions per slot: every state key of SPREAD_RULES rules for SPREAD_IDENTITIES
    clients, through the package's key functions; and the number of keys."""
    from redis.crc import key_slot

    from django_throttle.store.base import state_key

    rules = Rules()
    made = [rules.make(ALGORITHMS[k % len(ALGORITHMS)]) for k in range(SPREAD_RULES)]
    half = SPREAD_IDENTITIES // 2
    identities = [f"ip:10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(half)]
    identities += [f"user:{i + 1}" for i in range(SPREAD_IDENTITIES - half)]
    per_slot: Counter[int] = Counter()
    for identity in identities:
        for rule in made:
            per_slot[key_slot(state_key(rule, identity).encode())] += 1
    return per_slot, len(identities) * len(made)


def spread(per_slot: Counter[int], masters: int) -> tuple[float, float]:
    """The busiest master's share of the keys, and the mean share."""
    shares = [sum(per_slot[s] for s in range(a, b + 1)) for a, b in slot_ranges(masters)]
    return max(shares) / sum(shares), 1 / masters


def cluster_node() -> harness.RedisServer:
    """One cluster-enabled node holding every slot, pinned like the plain server."""
    port = redis_topology.cluster_port(set())
    args = ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
    node = harness.RedisServer(cpu=harness.CPU, port=port, args=args)
    node.start()
    with redis_topology.admin(port) as client:
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, SLOTS - 1)
        wait_until(
            lambda: "cluster_state:ok" in client.execute_command("CLUSTER", "INFO"), 30, 0.05
        )
    return node


def run_on(
    server: Any, kind: str, addrs: list[str], rounds: int, seconds: float, connections: int
) -> list[Case]:
    """Every algorithm's case measured on ``server``; on the plain node, the reference rows too."""
    import redis

    from django_throttle.store.redis import DECIDE_SHA, DECIDE_SOURCE

    admin = redis.Redis(host=harness.HOST, port=server.port, socket_timeout=30)
    try:
        assert admin.script_load(DECIDE_SOURCE) == DECIDE_SHA
        rules = Rules()
        cases = [decide_case(rules, a, 1, addrs) for a in ALGORITHMS]
        cases.append(decide_case(rules, "fixed_window", 3, addrs))
        if kind == "plain":
            cases += reference_cases(admin, addrs)
        measure(server.port, admin, cases, rounds, seconds=seconds, connections=connections)
        return cases
    finally:
        admin.close()


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def per_core(case: Case) -> float:
    """Calls per second of the server's CPU time: what one core kept busy answers."""
    return case.median(lambda t: t.calls / t.server_cpu)


def figures(case: Case) -> tuple[str, ...]:
    """Calls/s, server CPU %, calls per server CPU-second, server µs per call, load CPU %."""
    return (
        f"{round(case.median(lambda t: t.calls / t.wall), -2):.0f}",
        f"{case.median(lambda t: t.server_cpu / t.wall) * 100:.0f}",
        f"{round(per_core(case), -2):.0f}",
        f"{case.median(lambda t: t.usec / t.calls):.2f}",
        f"{case.median(lambda t: t.load_cpu / t.wall) * 100:.0f}",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 0.4 s per case")
    parser.add_argument("--no-cluster-node", action="store_true", help="plain node only")
    parser.add_argument("--connections", type=int, default=CONNECTIONS, help=f"({CONNECTIONS})")
    args = parser.parse_args()
    rounds, seconds = (2, 0.4) if args.quick else (5, 1.2)
    started = time.monotonic()
    load_cpu = (harness.CPU + 1) % (os.cpu_count() or 1)
    if load_cpu == harness.CPU:
        print("one CPU only: the load shares it with redis-server", file=sys.stderr)
    harness.print_machine()
    print(f"\nLoad average before the run: {load()}")
    addrs = harness.addresses(IDENTITIES)
    results: dict[str, list[Case]] = {}
    for kind in ["plain"] if args.no_cluster_node else ["plain", "cluster"]:
        server = cluster_node() if kind == "cluster" else harness.RedisServer(cpu=harness.CPU)
        try:
            if kind == "plain":
                server.start()
                harness.configure_django(server.url)  # the key prefix, the store's settings
            os.sched_setaffinity(0, {load_cpu})
            results[kind] = run_on(server, kind, addrs, rounds, seconds, args.connections)
        finally:
            server.close()

    how = (
        f"{args.connections} connections, one EVALSHA at a time on each, {IDENTITIES:,} "
        f"clients; redis-server on CPU {harness.CPU}, the load on CPU {load_cpu}; "
        f"{rounds} x {seconds:g} s per case, medians over the rounds"
    )
    print(f"\n## Decisions per second of one redis-server core ({how})\n")
    header = ("command", "calls/s", "server CPU %", "calls per server CPU-second")
    harness.table(
        (*header, "server µs per call (commandstats)", "load generator CPU %"),
        [(c.name, *figures(c)) for c in results["plain"]],
    )
    print(
        "\ncalls per server CPU-second: the calls over the CPU time redis-server used for them"
        " (INFO cpu), what one core kept busy answers; calls/s is the same when the server CPU"
        " is 100%."
    )
    short = [c for c in results["plain"] if c.median(lambda t: t.server_cpu / t.wall) < SATURATED]
    if short:
        print(
            f"Server CPU below {SATURATED:.0%} in {len(short)} of {len(results['plain'])} rows: "
            f"its core shared with other work (load average {load()}), or the load too light "
            f"for it (more --connections)."
        )
    if "cluster" in results:
        print("\n## The same on a cluster-enabled node holding every slot\n")
        harness.table(
            (*header, "µs per call"), [(c.name, *figures(c)[:4]) for c in results["cluster"]]
        )

    per_slot, n_keys = key_spread()
    basis = results.get("cluster", results["plain"])
    ones = [c for c in basis if c.name in ALGORITHMS]
    print(
        f"\n## A cluster of N masters: the busiest master's share of {n_keys:,} state keys "
        f"({SPREAD_IDENTITIES:,} clients x {SPREAD_RULES} rules), and the decisions per second "
        f"it sustains (derived: N x the measured rate per core of a "
        f"{'cluster-enabled' if 'cluster' in results else 'plain'} node x mean / busiest)\n"
    )
    rows = []
    for n in MASTERS:
        busiest, mean = spread(per_slot, n)
        derived = (f"{round(n * per_core(c) * mean / busiest, -2):.0f}" for c in ones)
        rows.append((n, f"{busiest * 100:.2f}", f"{mean * 100:.2f}", f"{busiest / mean:.3f}"))
        rows[-1] += tuple(derived)
    harness.table(
        ("masters", "busiest %", "mean %", "busiest / mean", *(c.name for c in ones)), rows
    )
    print(f"\nLoad average after the run: {load()}. Run time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
