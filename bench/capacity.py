"""Decisions per second one redis-server core sustains, 16 clients at a time, and what that
makes of a cluster of N masters (docs/benchmarks.md, "Capacity per Redis core")."""

from __future__ import annotations

import argparse
import math
import os
import resource
import select
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import harness
from script import ALGORITHMS, Rules, admitted

from tests.redis_topology import cluster_port

CONNECTIONS = 16  # web processes, each waiting for its reply before it sends again
IDENTITIES = 10_000  # distinct clients the load goes round
MASTERS = (1, 3, 6, 12, 24)
SPREAD_IDENTITIES = 100_000  # half addresses, half user ids
SPREAD_RULES = 3
SLOTS = 16384
SATURATED = 0.9  # server CPU share from which the core counts as kept busy

# The commands of limits' FixedWindow script (limits/resources/redis/lua_scripts/
# incr_expire.lua), when the limits package is not installed to read it from: INCRBY, then
# EXPIRE when the key is new. ARGV: expiry (s), amount.
LIMITS_INCR_EXPIRE = """
local n = redis.call('INCRBY', KEYS[1], ARGV[2])
if n == tonumber(ARGV[2]) then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return n
"""

# The commands of rate-limiter-flexible's RateLimiterRedis script (lib/RateLimiterRedis.js):
# SET NX EX (a new key at 0 with its expiry), INCRBY, PTTL; its TTL repair (EXPIRE when a
# key has none) never runs here. ARGV: points, duration (s).
FLEXIBLE_INCR_TTL = """
redis.call('SET', KEYS[1], 0, 'EX', ARGV[2], 'NX')
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
return {n, redis.call('PTTL', KEYS[1])}
"""


# -- the wire -------------------------------------------------------------------------------


def command(*args: Any) -> bytes:
    """A command in the Redis protocol, as redis-py frames it."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def parse(buffer: bytes, at: int = 0) -> tuple[Any, int] | None:
    """One reply from ``buffer[at:]`` and where it ends; None if it is not all there."""
    end = buffer.find(b"\r\n", at)
    if end < 0:
        return None
    kind, line = buffer[at : at + 1], buffer[at + 1 : end]
    if kind == b":":
        return int(line), end + 2
    if kind in (b"+", b"-"):
        return (line.decode() if kind == b"+" else RuntimeError(line.decode())), end + 2
    if kind == b"$":
        n = int(line)
        if n < 0:
            return None, end + 2
        if len(buffer) < end + 2 + n + 2:
            return None
        return buffer[end + 2 : end + 2 + n], end + 2 + n + 2
    assert kind == b"*", buffer[at : at + 20]
    items, pos = [], end + 2
    for _ in range(int(line)):
        found = parse(buffer, pos)
        if found is None:
            return None
        item, pos = found
        items.append(item)
    return items, pos


def call(sock: socket.socket, request: bytes, commands: int = 1) -> tuple[Any, bytes]:
    """One request of ``commands`` commands on a blocking socket: the first reply and the
    bytes of all."""
    sock.sendall(request)
    buffer, replies, at = b"", [], 0
    while len(replies) < commands:
        buffer += sock.recv(65536)
        while len(replies) < commands and (found := parse(buffer, at)) is not None:
            reply, at = found
            if isinstance(reply, RuntimeError):
                raise reply
            replies.append(reply)
    assert at == len(buffer), "one reply per command"
    return replies[0], buffer


def connect(port: int) -> socket.socket:
    sock = socket.create_connection((harness.HOST, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


# -- the load -------------------------------------------------------------------------------


@dataclass
class Turn:
    """What one turn of load on a case measured."""

    calls: int
    wall: float
    server_cpu: float
    load_cpu: float
    usec: int  # INFO commandstats: the time of the commands counted


@dataclass
class Case:
    """A command sent as ``requests[i % len]`` (a client each), how to tell that a reply
    admitted the call, and its turns of load; each figure is the median over the turns."""

    name: str
    requests: list[bytes]
    admitted: Callable[[Any], bool] | None = None  # None: any reply but an error
    counted: tuple[str, ...] = ("evalsha",)  # the commands of a call, one each (commandstats)
    lines: int = 0  # CRLFs in one reply: every reply of a case has the same shape
    turns: list[Turn] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return harness.median([t.calls / t.wall for t in self.turns])

    @property
    def per_core(self) -> float:
        """Calls per second of the server's CPU time: what one core kept busy answers."""
        return harness.median([t.calls / t.server_cpu for t in self.turns])

    @property
    def server_share(self) -> float:
        return harness.median([t.server_cpu / t.wall for t in self.turns])

    @property
    def load_share(self) -> float:
        return harness.median([t.load_cpu / t.wall for t in self.turns])

    @property
    def us(self) -> float:
        return harness.median([t.usec / t.calls for t in self.turns])


def drive(port: int, case: Case, start: int, calls: int = 0, seconds: float = 0.0) -> int:
    """CONNECTIONS connections, each sending the case's next request when its last reply is
    all in (counted by its CRLFs), until ``calls`` are sent or ``seconds`` have passed; the
    number answered."""
    requests, n, lines = case.requests, len(case.requests), case.lines
    socks = [connect(port) for _ in range(min(CONNECTIONS, calls) if calls else CONNECTIONS)]
    poller = select.epoll()
    by_fd, seen = {}, {}
    i = start
    try:
        for sock in socks:
            sock.setblocking(False)
            by_fd[sock.fileno()] = sock
            seen[sock.fileno()] = 0
            poller.register(sock.fileno(), select.EPOLLIN)
        for sock in socks:
            sock.send(requests[i % n])
            i += 1
        done, open_ = 0, len(socks)
        sending = True
        deadline = time.perf_counter() + seconds
        while open_:
            for fd, _ in poller.poll():
                sock = by_fd[fd]
                data = sock.recv(65536)
                if not data or data[:1] == b"-":
                    said = repr(data[:200]) if data else "connection closed"
                    raise RuntimeError(f"{case.name}: {said}")
                got = seen[fd] + data.count(b"\r\n")
                if got < lines:
                    seen[fd] = got
                    continue
                seen[fd] = 0
                done += 1
                if sending:
                    if calls:
                        sending = i - start < calls
                    elif done & 255 == 0:  # the clock read now and then: it costs a call
                        sending = time.perf_counter() < deadline
                if sending:
                    sock.send(requests[i % n])
                    i += 1
                else:
                    poller.unregister(fd)
                    open_ -= 1
        return done
    finally:
        poller.close()
        for sock in socks:
            sock.close()


def server_cpu(admin: Any) -> float:
    info = admin.info("cpu")
    return float(info["used_cpu_sys"] + info["used_cpu_user"])


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def prepare(port: int, admin: Any, case: Case) -> None:
    """The reply's shape from one call, then one call per client (every state written)."""
    with connect(port) as sock:
        reply, raw = call(sock, case.requests[0], len(case.counted))
    assert case.admitted is None or case.admitted(reply), f"{case.name}: not admitted ({reply})"
    case.lines = raw.count(b"\r\n")
    if len(case.requests) > 1:
        drive(port, case, 1, calls=len(case.requests) - 1)


def check_admitted(port: int, case: Case) -> None:
    """Calls of a few clients after the run: each still admitted (at these limits every call
    is; a reply that was not would show a limit too low for the run)."""
    if case.admitted is None:
        return
    with connect(port) as sock:
        for i in range(0, len(case.requests), max(1, len(case.requests) // 16)):
            reply, _ = call(sock, case.requests[i])
            assert case.admitted(reply), f"{case.name}: not admitted ({reply})"


def measure(port: int, admin: Any, cases: list[Case], rounds: int, seconds: float) -> None:
    """Every case prepared, then ``rounds`` turns of ``seconds`` of load per case from a
    rotating first case, server CPU (INFO cpu), our CPU and the commands' time (INFO
    commandstats) read around each: other work on the machine hits every case alike."""
    for case in cases:
        prepare(port, admin, case)
    start = 0
    for turn in range(rounds):
        k = turn % len(cases)
        for case in (*cases[k:], *cases[:k]):
            admin.config_resetstat()
            cpu0, own0, t0 = server_cpu(admin), own_cpu(), time.perf_counter()
            done = drive(port, case, start, seconds=seconds)
            wall = time.perf_counter() - t0
            load_cpu, cpu = own_cpu() - own0, server_cpu(admin) - cpu0
            stats = admin.info("commandstats")
            mine = [stats[f"cmdstat_{name}"] for name in case.counted]
            assert all(m["calls"] == done for m in mine), (case.name, done, mine)
            failed = sum(
                s.get("failed_calls", 0) + s.get("rejected_calls", 0) for s in stats.values()
            )
            assert not failed, f"{case.name}: {failed} failed calls ({stats})"
            case.turns.append(Turn(done, wall, cpu, load_cpu, sum(m["usec"] for m in mine)))
        start += 1_000_003  # another stretch of clients' turns
    for case in cases:
        check_admitted(port, case)


# -- the cases ------------------------------------------------------------------------------


def decide_case(rules: Rules, algorithm: str, n: int, addrs: list[str]) -> Case:
    """decide.lua with ``n`` checks of ``algorithm`` (rules of their own) for one client, the
    bytes the package sends (packed_decide)."""
    from django_throttle.store import Check
    from django_throttle.store.redis import ServerClock, packed_decide

    made = [rules.make(algorithm) for _ in range(n)]
    clock = ServerClock()
    # No block of block_key() lives: block keys are not sent (the store's BlockReads).
    requests = [
        packed_decide([Check(r, f"ip:{a}") for r in made], False, clock, False) for a in addrs
    ]
    label = algorithm if n == 1 else f"{algorithm}, {n} checks"
    return Case(label, requests, admitted=admitted)


def limits_source() -> tuple[str, str]:
    """limits' FixedWindow script: from the package if installed, else the copy above."""
    try:
        from importlib.resources import files

        path = files("limits.resources.redis.lua_scripts").joinpath("incr_expire.lua")
        return path.read_text(), f"incr_expire.lua of limits {harness.version('limits')}"
    except (ImportError, FileNotFoundError):
        return LIMITS_INCR_EXPIRE, "limits is not installed: the copy in bench/capacity.py"


def reference_cases(admin: Any, addrs: list[str]) -> list[Case]:
    source, origin = limits_source()
    sha = admin.script_load(source)
    # limits' key for a 10^9 per hour limit, and its ARGV: expiry, amount.
    requests = [
        command("EVALSHA", sha, 1, f"LIMITS:LIMITER/ip:{a}/1000000000/1/hour", 3600, 1)
        for a in addrs
    ]
    floor = Case("`return 1`", [command("EVALSHA", admin.script_load("return 1"), 0)])
    limits = Case("limits FixedWindow `hit()`'s script", requests)
    print(f"limits' script: {origin}")
    sha = admin.script_load(FLEXIBLE_INCR_TTL)
    flexible = Case(
        "rate-limiter-flexible RateLimiterRedis's commands",
        [command("EVALSHA", sha, 1, f"rlflx:ip:{a}", 1, 3600) for a in addrs],
    )
    # Envoy's ratelimit (src/redis/fixed_cache_impl.go): INCRBY and EXPIRE per descriptor,
    # pipelined, no script; its key: domain, descriptor and the window's start.
    envoy = Case(
        "Envoy ratelimit's commands (INCRBY + EXPIRE, pipelined)",
        [
            command("INCRBY", f"domain_ip_{a}_1733097600", 1)
            + command("EXPIRE", f"domain_ip_{a}_1733097600", 3600)
            for a in addrs
        ],
        counted=("incrby", "expire"),
    )
    return [floor, limits, flexible, envoy]


# -- a cluster of N masters -----------------------------------------------------------------


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
    shares = [
        sum(per_slot[s] for s in range(first, last + 1)) for first, last in slot_ranges(masters)
    ]
    total = sum(shares)
    return max(shares) / total, 1 / masters


# -- main -----------------------------------------------------------------------------------


def cluster_node() -> harness.RedisServer:
    """One cluster-enabled node holding every slot, pinned like the plain server."""
    port = cluster_port(set())
    node = harness.RedisServer(
        cpu=harness.CPU,
        port=port,
        args=["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"],
    )
    node.start()
    import redis

    admin = redis.Redis(host=harness.HOST, port=port, decode_responses=True)
    admin.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, SLOTS - 1)
    deadline = time.monotonic() + 30
    while admin.execute_command("CLUSTER", "INFO").find("cluster_state:ok") < 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the one-node cluster did not come up")
        time.sleep(0.05)
    admin.close()
    return node


def run_on(server: Any, kind: str, addrs: list[str], rounds: int, seconds: float) -> list[Case]:
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
        measure(server.port, admin, cases, rounds, seconds)
        return cases
    finally:
        admin.close()


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def k(value: float) -> str:
    """To the nearest hundred: ``41300``."""
    return f"{round(value, -2):.0f}"


def main() -> int:
    global CONNECTIONS
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 0.4 s per case")
    parser.add_argument("--no-cluster-node", action="store_true", help="plain node only")
    parser.add_argument("--connections", type=int, help=f"instead of {CONNECTIONS}")
    args = parser.parse_args()
    CONNECTIONS = args.connections or CONNECTIONS
    rounds, seconds = (2, 0.4) if args.quick else (5, 1.2)
    started = time.monotonic()
    cpus = os.cpu_count() or 1
    load_cpu = (harness.CPU + 1) % cpus
    if load_cpu == harness.CPU:
        print("one CPU only: the load shares it with redis-server", file=sys.stderr)
    harness.print_machine()
    print(f"\nLoad average before the run: {load()}")
    addrs = harness.addresses(IDENTITIES)
    results: dict[str, list[Case]] = {}
    kinds = ["plain"] if args.no_cluster_node else ["plain", "cluster"]
    for kind in kinds:
        server = cluster_node() if kind == "cluster" else harness.RedisServer(cpu=harness.CPU)
        try:
            if kind == "plain":
                server.start()
                harness.configure_django(server.url)  # the key prefix, the store's settings
            os.sched_setaffinity(0, {load_cpu})
            results[kind] = run_on(server, kind, addrs, rounds, seconds)
        finally:
            server.close()

    how = (
        f"{CONNECTIONS} connections, one EVALSHA at a time on each, {IDENTITIES:,} clients; "
        f"redis-server on CPU {harness.CPU}, the load on CPU {load_cpu}; "
        f"{rounds} x {seconds:g} s per case, medians over the rounds"
    )
    print(f"\n## Decisions per second of one redis-server core ({how})\n")
    rows = []
    for case in results["plain"]:
        rows.append(
            (
                case.name,
                k(case.per_second),
                f"{case.server_share * 100:.0f}",
                k(case.per_core),
                f"{case.us:.2f}",
                f"{case.load_share * 100:.0f}" if case.requests else "-",
            )
        )
    harness.table(
        (
            "command",
            "calls/s",
            "server CPU %",
            "calls per server CPU-second",
            "server µs per call (commandstats)",
            "load generator CPU %",
        ),
        rows,
    )
    print(
        "\ncalls per server CPU-second: the calls over the CPU time redis-server used for them"
        " (INFO cpu), what one core kept busy answers; calls/s is the same when the server CPU"
        " is 100%."
    )
    short = [c for c in results["plain"] if c.server_share < SATURATED]
    if short:
        print(
            f"Server CPU below {SATURATED:.0%} in {len(short)} of {len(results['plain'])} rows: "
            f"its core shared with other work (load average {load()}), or the load too light "
            f"for it (more --connections)."
        )

    if "cluster" in results:
        print("\n## The same on a cluster-enabled node holding every slot\n")
        harness.table(
            ("command", "calls/s", "server CPU %", "calls per server CPU-second", "µs per call"),
            [
                (
                    c.name,
                    k(c.per_second),
                    f"{c.server_share * 100:.0f}",
                    k(c.per_core),
                    f"{c.us:.2f}",
                )
                for c in results["cluster"]
            ],
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
        factor = mean / busiest
        rows.append(
            (
                n,
                f"{busiest * 100:.2f}",
                f"{mean * 100:.2f}",
                f"{busiest / mean:.3f}",
                *(k(n * c.per_core * factor) for c in ones),
            )
        )
    harness.table(
        ("masters", "busiest %", "mean %", "busiest / mean", *(c.name for c in ones)), rows
    )
    print(f"\nLoad average after the run: {load()}. Run time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
