"""decide.lua's server time per check beside minimal scripts (docs/benchmarks.md, "decide.lua beside
a minimal script"). Shared with bench/capacity.py: the calls sent as the bytes of the Redis
protocol on raw sockets, in turns of load with INFO commandstats read around each."""

from __future__ import annotations

import argparse
import glob
import re
import resource
import select
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
import hiredis
from harness import HOUR

LIMIT = 10**9  # per hour: every call is admitted
# The buckets' rate per hour, their burst LIMIT: each call leaves 3.6 s of backlog, so every
# call finds its client's state (at 10^9 an hour a bucket drains between a client's calls,
# its key expiring after 1 ms), and every call is admitted all the same.
BUCKET_RATE = 1000
BUCKETS = ("token_bucket", "leaky_bucket")
CHECKS = (1, 3, 5)
# decide.lua's server time per check over the minimal script's, at most (issue 24).
RATIO_TARGET = {
    "fixed_window": 1.25,
    "sliding_window_counter": 1.25,
    "sliding_window_log": 1.3,
    "token_bucket": 1.15,
    "leaky_bucket": 1.15,
    "concurrency": 1.3,
}
ALGORITHMS = tuple(RATIO_TARGET)  # in the order of issue 14
INSTRUCTION_CALLS = 300  # --instructions: calls counted per case

# The minimal scripts: one check on the admitted path, each algorithm's work done plainly with the
# fewest Redis commands (issue 24's definitions), nothing else: no block key, no limit compared
# (every call is admitted), no reply built. KEYS[1] is the package's state key for the client,
# under which a window's key is made; ARGV is what the arithmetic needs (minimal_args).

# Fixed window: TIME, INCRBY of the window's own key, PEXPIRE (until the window ends) only when
# the key is new. ARGV: period (s), cost.
WINDOW = """
local t = redis.call('TIME')
local p = tonumber(ARGV[1])
local w = math.floor(t[1] / p)
local key = KEYS[1] .. ':' .. w
local cost = tonumber(ARGV[2])
if redis.call('INCRBY', key, cost) == cost then
  redis.call('PEXPIRE', key, (w + 1) * p * 1000 - (t[1] * 1000 + math.floor(t[2] / 1000)))
end
return 1
"""

# Sliding window counter: the same and a GET of the previous window's count. ARGV: period (s), cost.
COUNTER = """
local t = redis.call('TIME')
local p = tonumber(ARGV[1])
local w = math.floor(t[1] / p)
local prev = tonumber(redis.call('GET', KEYS[1] .. ':' .. (w - 1)) or 0)
local key = KEYS[1] .. ':' .. w
local cost = tonumber(ARGV[2])
if redis.call('INCRBY', key, cost) == cost then
  redis.call('PEXPIRE', key, (w + 2) * p * 1000 - (t[1] * 1000 + math.floor(t[2] / 1000)))
end
return prev
"""

# Sliding window log and concurrency (one entry, cost 1): TIME, ZREMRANGEBYSCORE of the entries
# past the trailing period, ZCARD, ZADD, PEXPIRE (until the entry leaves it). ARGV: period (µs).
LOG = """
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local key = KEYS[1]
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - ARGV[1]))
redis.call('ZCARD', key)
local stamp = string.format('%d', now)
redis.call('ZADD', key, stamp, stamp .. '000')
redis.call('PEXPIRE', key, math.ceil(ARGV[1] / 1000))
return 1
"""

# Token and leaky bucket: TIME, GET, SET "arrival time" PX (until the bucket is empty again).
# ARGV: period (µs), limit, cost.
BUCKET = """
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local tat = tonumber(redis.call('GET', KEYS[1]) or 0)
if tat < now then tat = now end
local backlog = tat - now + ARGV[3] * ARGV[1] / ARGV[2]
redis.call('SET', KEYS[1], string.format('%d', now + math.floor(backlog)), 'PX',
  math.ceil(backlog / 1000))
return 1
"""

MINIMAL = {"fixed_window": WINDOW, "sliding_window_counter": COUNTER, "sliding_window_log": LOG}
MINIMAL |= {"token_bucket": BUCKET, "leaky_bucket": BUCKET, "concurrency": LOG}


def minimal_args(rule: Any, cost: int = 1) -> list[Any]:
    """ARGV of the algorithm's minimal script for one check of ``rule``."""
    if rule.algorithm in ("fixed_window", "sliding_window_counter"):
        return [rule.period, cost]
    if rule.algorithm in ("sliding_window_log", "concurrency"):
        return [rule.period * 1_000_000]
    return [rule.period * 1_000_000, rule.limit, cost]


def command(*args: Any) -> bytes:
    """A command in the Redis protocol, as redis-py frames it."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection((harness.HOST, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def call(sock: socket.socket, request: bytes, commands: int = 1) -> tuple[Any, bytes]:
    """One request of ``commands`` commands on a blocking socket: the first reply, all bytes."""
    sock.sendall(request)
    reader, buffer, replies = hiredis.Reader(), b"", []
    while len(replies) < commands:
        buffer += (data := sock.recv(65536))
        reader.feed(data)
        while len(replies) < commands and (reply := reader.gets()) is not False:
            if isinstance(reply, hiredis.ReplyError):
                raise RuntimeError(reply)
            replies.append(reply)
    assert reader.gets() is False, "one reply per command"
    return replies[0], buffer


@dataclass
class Turn:
    """What one turn of load on a case measured."""

    calls: int
    wall: float
    server_cpu: float
    load_cpu: float
    usec: int  # INFO commandstats: the time of the commands counted (--instructions: their count)
    commands: Counter[str]  # what the calls made the server run, by command


@dataclass
class Case:
    """A command sent as ``requests[i % len]`` (a client each), how to tell that a reply
    admitted the call, and its turns of load."""

    name: str
    requests: list[bytes]
    admitted: Callable[[Any], bool] | None = None  # None: any reply but an error
    counted: tuple[str, ...] = ("evalsha",)  # the commands of a call, one each (commandstats)
    key: str = ""  # the first client's state key
    rules: list[Any] = field(default_factory=list)  # decide.lua's checks, in order
    lines: int = 0  # CRLFs in one reply: every reply of a case has the same shape
    turns: list[Turn] = field(default_factory=list)

    @property
    def us(self) -> float:
        """Server µs per call over every turn (--instructions: instructions per call)."""
        return sum(t.usec for t in self.turns) / sum(t.calls for t in self.turns)

    def median(self, figure: Callable[[Turn], float]) -> float:
        return harness.median([figure(t) for t in self.turns])

    def per_call(self) -> str:
        """``get 1, set 1, time 1``: the commands it made per call."""
        made = sum((t.commands for t in self.turns), Counter())
        calls = sum(t.calls for t in self.turns)
        return ", ".join(f"{c} {n / calls:g}" for c, n in sorted(made.items()))


def drive(
    port: int, case: Case, start: int, calls: int = 0, seconds: float = 0.0, connections: int = 1
) -> int:
    """``connections`` connections, each sending the case's next request when its last reply is
    all in (counted by its CRLFs), until ``calls`` are sent or ``seconds`` have passed; the
    number answered."""
    requests, n, lines = case.requests, len(case.requests), case.lines
    socks = [connect(port) for _ in range(min(connections, calls) if calls else connections)]
    by_fd = {sock.fileno(): sock for sock in socks}
    seen, poller, i = dict.fromkeys(by_fd, 0), select.epoll(), start
    try:
        for fd, sock in by_fd.items():
            sock.setblocking(False)
            poller.register(fd, select.EPOLLIN)
        for sock in socks:
            sock.send(requests[i % n])
            i += 1
        done, open_, sending = 0, len(socks), True
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


def cpu_times(admin: Any) -> tuple[float, float]:
    """The CPU time redis-server has used (INFO cpu), and this process."""
    server, usage = admin.info("cpu"), resource.getrusage(resource.RUSAGE_SELF)
    return server["used_cpu_sys"] + server["used_cpu_user"], usage.ru_utime + usage.ru_stime


def prepare(port: int, case: Case, connections: int = 1) -> None:
    """The reply's shape from one call, then one call per client (every state written)."""
    with connect(port) as sock:
        reply, raw = call(sock, case.requests[0], len(case.counted))
    assert case.admitted is None or case.admitted(reply), f"{case.name}: not admitted ({reply})"
    case.lines = raw.count(b"\r\n")
    if len(case.requests) > 1:
        drive(port, case, 1, calls=len(case.requests) - 1, connections=connections)


def check_admitted(port: int, case: Case) -> None:
    """Calls of a few clients after the run, each still admitted (else a limit was too low)."""
    with connect(port) as sock:
        for i in range(0, len(case.requests), max(1, len(case.requests) // 16)):
            reply, _ = call(sock, case.requests[i], len(case.counted))
            assert case.admitted is None or case.admitted(reply), f"{case.name}: {reply}"


def turn(
    port: int, admin: Any, case: Case, start: int, calls: int, seconds: float, connections: int
) -> None:
    """One turn of load on ``case``, INFO cpu, our CPU and INFO commandstats read around it."""
    admin.config_resetstat()
    (cpu0, own0), t0 = cpu_times(admin), time.perf_counter()
    done = drive(port, case, start, calls, seconds, connections)
    wall, (cpu, own) = time.perf_counter() - t0, cpu_times(admin)
    cpu, load_cpu = cpu - cpu0, own - own0
    stats = admin.info("commandstats")
    mine = [stats[f"cmdstat_{name}"] for name in case.counted]
    assert all(m["calls"] == done for m in mine), (case.name, done, mine)
    failed = sum(s.get("failed_calls", 0) + s.get("rejected_calls", 0) for s in stats.values())
    assert not failed, f"{case.name}: {failed} failed calls ({stats})"
    made = Counter({k.removeprefix("cmdstat_"): s["calls"] for k, s in stats.items()})
    for command in ("evalsha", "config|resetstat", "info"):
        del made[command]
    case.turns.append(Turn(done, wall, cpu, load_cpu, sum(m["usec"] for m in mine), made))


def measure(
    port: int,
    admin: Any,
    cases: list[Case],
    rounds: int,
    calls: int = 0,
    seconds: float = 0.0,
    connections: int = 1,
) -> None:
    """Every case prepared, then ``rounds`` turns of ``calls`` calls or ``seconds`` of load per
    case from a rotating first case: other work on the machine hits every case alike."""
    for case in cases:
        prepare(port, case, connections)
    start = 0
    for k in range(rounds):
        for case in (*cases[k % len(cases) :], *cases[: k % len(cases)]):
            turn(port, admin, case, start, calls, seconds, connections)
        start += calls or 1_000_003  # another stretch of clients' turns
    for case in cases:
        check_admitted(port, case)


class Rules:
    """Compiled rules with ids of their own: every case writes keys no other case touches."""

    next_id = 1

    def make(self, algorithm: str) -> Any:
        self.next_id += 1
        rate, burst = (BUCKET_RATE, LIMIT) if algorithm in BUCKETS else (LIMIT, None)
        return harness.make_rule(self.next_id, algorithm, rate, HOUR, burst=burst)


def admitted(reply: Any) -> bool:
    """A reply of decide.lua (packed doubles) that admitted the request."""
    from django_throttle.store.redis import unpacked

    return unpacked(reply)[1] == 1


def decide_case(rules: Rules, algorithm: str, n: int, addrs: list[str]) -> Case:
    """decide.lua with ``n`` checks of ``algorithm`` (rules of their own) for one client, the
    bytes the package sends (packed_decide)."""
    from django_throttle.store import Check
    from django_throttle.store.base import state_key
    from django_throttle.store.redis import ServerClock, packed_decide

    made = [rules.make(algorithm) for _ in range(n)]
    clock = ServerClock()
    # No block of block_key() lives: block keys are not sent (the store's BlockReads).
    requests = [
        packed_decide([Check(r, f"ip:{a}") for r in made], False, clock, False) for a in addrs
    ]
    label = algorithm if n == 1 else f"{algorithm}, {n} checks"
    return Case(label, requests, admitted, key=state_key(made[0], f"ip:{addrs[0]}"), rules=made)


def minimal_case(admin: Any, rules: Rules, algorithm: str, addrs: list[str]) -> Case:
    """The minimal script on the state key the package would use for a rule of its own."""
    from django_throttle.store.base import state_key

    rule = rules.make(algorithm)
    sha = admin.script_load(MINIMAL[algorithm])
    keys = [state_key(rule, f"ip:{a}") for a in addrs]
    requests = [command("EVALSHA", sha, 1, key, *minimal_args(rule)) for key in keys]
    return Case("minimal script", requests, key=keys[0])


def variant_case(admin: Any, source: str, rules: list[Any], addrs: list[str]) -> Case:
    """Another version of decide.lua, on the input of the package's 1-check case (its own keys:
    a prefix of its own, so each version counts on its own state)."""
    from django_throttle.store import Check
    from django_throttle.store.redis import ServerClock, script_input

    sha, requests = admin.script_load(source), []
    for address in addrs:
        checks = [Check(r, f"ip:{address}") for r in rules]
        keys, args = script_input(checks, False, ServerClock(), False)
        requests.append(command("EVALSHA", sha, len(keys), *(f"v:{k}" for k in keys), *args))
    return Case("decide.lua (--against), 1 check", requests, admitted)


class CallgrindServer(harness.RedisServer):
    """The bench's redis-server under valgrind's callgrind, which counts the instructions run
    inside evalGenericCommand (EVALSHA) only; zeroed and read between cases."""

    def command(self) -> list[str]:
        if shutil.which("valgrind") is None:
            raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
        args = ["valgrind", "--tool=callgrind", "--toggle-collect=evalGenericCommand"]
        args.append(f"--callgrind-out-file={self.dir}/callgrind.out")
        server = super().command()
        pinned = 3 if server[0] == "taskset" else 0  # taskset execs valgrind: one process
        return [*server[:pinned], *args, *server[pinned:]]

    def start(self, timeout: float = 120.0) -> None:
        super().start(timeout)

    def control(self, option: str) -> None:
        assert self.process is not None
        subprocess.run(["callgrind_control", option, str(self.process.pid)], capture_output=True)

    def counted(self) -> int:
        """The instructions counted since the last zeroing (dumped to a file, read back)."""
        before = set(glob.glob(f"{self.dir}/callgrind.out*"))
        self.control("-d")
        (dump,) = set(glob.glob(f"{self.dir}/callgrind.out*")) - before
        with open(dump, encoding="utf-8") as file:
            for line in file:
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
        raise RuntimeError(f"no totals in {dump}")


def count_instructions(admin: Any, server: CallgrindServer, cases: list[Case]) -> None:
    """Per case, a call per client (its states written, right before: under valgrind a bucket
    would drain), then INSTRUCTION_CALLS calls counted: a turn whose ``usec`` holds the
    instructions, so ``us`` is instructions per call."""
    for case in cases:
        prepare(server.port, case)
        server.control("-z")
        turn(server.port, admin, case, len(case.requests), INSTRUCTION_CALLS, 0.0, 1)
        case.turns[-1].usec = server.counted()
    for case in cases:  # every state there for the table of shapes, as measure() leaves them
        check_admitted(server.port, case)


def shape(admin: Any, key: str) -> str:
    """What a client's state holds, digits aside, under its state key (a window's key ends with
    ``:<window>``): ``string # (int, 56 B), TTL``; ``zset of 20 (...)``; one entry per key."""
    found = []
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", key) + "*"
    for name in sorted(admin.scan_iter(match=pattern, count=1000)):
        if name.endswith(b":b"):
            continue  # a block key
        kind = admin.type(name).decode()
        if kind == "string":
            held = re.sub(rb"\d+", b"#", admin.get(name)).decode()
        elif kind == "zset":
            held = f"of {admin.zcard(name)}"
        else:
            held = ""
        encoding = admin.object("encoding", name).decode()
        size = admin.memory_usage(name, samples=0)
        ttl = "TTL" if admin.pttl(name) > 0 else "no TTL"
        found.append(f"{kind} {held} ({encoding}, {size} B), {ttl}".replace("  ", " "))
    return "; ".join(found) or "none"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2 x 1000 calls a case, 200 clients")
    parser.add_argument("--instructions", action="store_true", help="CPU instructions per call")
    parser.add_argument("--against", help="another decide.lua to time beside the package's")
    args = parser.parse_args()
    rounds, per_round, n_clients = (2, 1000, 200) if args.quick else (5, 4000, 1000)
    unit, how = "µs", f"server time per call ({rounds} x {per_round} calls per case, "
    if args.instructions:
        unit, n_clients = "Ir", 300
        how = f"CPU instructions per call (callgrind, {INSTRUCTION_CALLS} calls per case, "
    how += f"{n_clients} clients" + ("" if args.instructions else ", INFO commandstats") + ")"
    started = time.monotonic()
    server_class = CallgrindServer if args.instructions else harness.RedisServer
    with server_class(cpu=harness.CPU) as server:
        harness.pin_client(harness.CPU)
        harness.configure_django(server.url)  # the key prefix and the store's settings
        import redis

        from django_throttle.store.redis import DECIDE_SHA, DECIDE_SOURCE

        admin = redis.Redis.from_url(server.url, socket_timeout=10)
        assert admin.script_load(DECIDE_SOURCE) == DECIDE_SHA
        addrs = harness.addresses(n_clients)
        rules = Rules()
        floor = Case("return 1", [command("EVALSHA", admin.script_load("return 1"), 0)])
        cases = {
            algorithm: [
                *(decide_case(rules, algorithm, n, addrs) for n in CHECKS),
                minimal_case(admin, rules, algorithm, addrs),
            ]
            for algorithm in ALGORITHMS
        }
        variants = {}
        if args.against:
            source = Path(args.against).read_text(encoding="utf-8")
            variants = {a: variant_case(admin, source, g[0].rules, addrs) for a, g in cases.items()}
        everything = [floor, *(c for group in cases.values() for c in group), *variants.values()]
        harness.print_machine()
        print(f"\n## decide.lua beside a minimal script, {how}\n", flush=True)
        if isinstance(server, CallgrindServer):
            count_instructions(admin, server, everything)
        else:
            measure(server.port, admin, everything, rounds, calls=per_round)

        rows = []
        for algorithm, (one, three, five, minimal) in cases.items():
            ratio, target = one.us / minimal.us, RATIO_TARGET[algorithm]
            extra = (five.us - one.us) / (CHECKS[2] - CHECKS[0])
            verdicts = (
                f"ratio {'met' if ratio <= target else 'not met'}, "
                f"extra {'met' if extra <= minimal.us else 'not met'}"
            )
            figures = (f"{c.us:.2f}" for c in (one, three, five, minimal))
            ratios = (f"{ratio:.2f}x (≤ {target}x)", f"{extra:.2f}", f"{extra / minimal.us:.2f}x")
            rows.append((algorithm, *figures, *ratios, verdicts))
        header = [f"decide.lua 1 check {unit}", f"3 checks {unit}", f"5 checks {unit}"]
        header += [f"minimal {unit}", "1 check / minimal", f"extra check {unit}"]
        header += ["extra / minimal (≤ 1.00x)", "targets"]
        harness.table(("algorithm", *header), rows)
        print(f"\n`return 1`: {floor.us:.2f} {unit} per call.")
        if variants:
            print(f"\n## {args.against} beside the package's decide.lua, 1 check\n")
            rows = []
            for a, v in variants.items():
                one, minimal = cases[a][0].us, cases[a][-1].us
                rows.append((a, f"{one:.2f}", f"{v.us:.2f}", f"{v.us / one:.2f}x"))
                rows[-1] += (f"{v.us / minimal:.2f}x",)
            header = ["algorithm", f"package {unit}", f"--against {unit}", "--against / package"]
            harness.table((*header, "/ minimal"), rows)

        print("\n## Redis commands per call and state left: decide.lua (1 check), minimal\n")
        rows = []
        for a, group in cases.items():
            one, minimal = group[0], group[-1]
            states = (shape(admin, one.key), shape(admin, minimal.key))
            rows.append((a, one.per_call(), minimal.per_call(), *states))
        header = ["algorithm", "decide.lua", "minimal", "state (decide.lua)", "state (minimal)"]
        harness.table(header, rows)
    print(f"\nRun time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
