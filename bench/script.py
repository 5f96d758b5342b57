"""decide.lua's server time per check beside minimal scripts (docs/benchmarks.md, "decide.lua beside
a minimal script")."""

from __future__ import annotations

import argparse
import glob
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import harness
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
UNIT = "µs"  # --instructions: "Ir", instructions per call
ALGORITHMS = tuple(RATIO_TARGET)  # in the order of issue 14

# -- the minimal scripts ------------------------------------------------------------------------
#
# One check on the admitted path, each algorithm's work done plainly with the fewest Redis
# commands (issue 24's definitions), nothing else: no block key, no limit compared (every call
# is admitted), no reply built. KEYS[1] is the package's state key for the client, under which a
# window's key is made; ARGV is what the arithmetic needs (minimal_args).

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

# Sliding window counter: the same, and a GET of the previous window's count. ARGV: period (s),
# cost.
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
# past the trailing period, ZCARD, ZADD, PEXPIRE (until the entry leaves the period). ARGV:
# period (µs).
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

MINIMAL = {
    "fixed_window": WINDOW,
    "sliding_window_counter": COUNTER,
    "sliding_window_log": LOG,
    "token_bucket": BUCKET,
    "leaky_bucket": BUCKET,
    "concurrency": LOG,
}


def minimal_args(rule: Any, cost: int = 1) -> list[Any]:
    """ARGV of the algorithm's minimal script for one check of ``rule``."""
    if rule.algorithm in ("fixed_window", "sliding_window_counter"):
        return [rule.period, cost]
    if rule.algorithm in ("sliding_window_log", "concurrency"):
        return [rule.period * 1_000_000]
    return [rule.period * 1_000_000, rule.limit, cost]


# -- the cases ----------------------------------------------------------------------------------


@dataclass
class Case:
    """EVALSHA of ``sha`` with ``inputs[i % clients]`` (number of keys, KEYS, ARGV) as call i;
    ``usec`` and ``calls`` from commandstats, ``commands`` what the script called in them."""

    name: str
    sha: str
    inputs: list[tuple[Any, ...]]
    usec: int = 0
    calls: int = 0
    commands: Counter[str] = field(default_factory=Counter)
    rules: list[Any] = field(default_factory=list)

    @property
    def us(self) -> float:
        return self.usec / self.calls

    def per_call(self) -> str:
        """``get 1, set 1, time 1``: the commands it made per call."""
        return ", ".join(f"{c} {n / self.calls:g}" for c, n in sorted(self.commands.items()))


class Rules:
    """Compiled rules with ids of their own: every case writes keys no other case touches."""

    def __init__(self) -> None:
        self.next_id = 1

    def make(self, algorithm: str) -> Any:
        from django_throttle.compiled import build_rule

        self.next_id += 1
        if algorithm not in BUCKETS:
            return harness.make_rule(self.next_id, algorithm, LIMIT, HOUR)
        return build_rule(
            id=self.next_id,
            name=f"bench-{self.next_id}",
            algorithm=algorithm,
            limit=BUCKET_RATE,
            period=HOUR,
            burst=LIMIT,
        )


def decide_case(client: Any, rules: Rules, algorithm: str, n: int, addrs: list[str]) -> Case:
    """decide.lua with ``n`` checks of ``algorithm`` for one client, with the package's input."""
    from django_throttle.store import Check
    from django_throttle.store.redis import DECIDE_SHA, DECIDE_SOURCE, ServerClock, script_input

    assert client.script_load(DECIDE_SOURCE) == DECIDE_SHA
    made = [rules.make(algorithm) for _ in range(n)]
    clock = ServerClock()
    inputs = []
    for address in addrs:
        keys, args = script_input([Check(r, f"ip:{address}") for r in made], False, clock, False)
        inputs.append((len(keys), *keys, *args))
    label = f"decide.lua, {n} check{'s' * (n > 1)}"
    return Case(label, DECIDE_SHA, inputs, rules=made)


def minimal_case(client: Any, rules: Rules, algorithm: str, addrs: list[str]) -> Case:
    """The minimal script on the state key the package would use for a rule of its own."""
    from django_throttle.store import Check
    from django_throttle.store.redis import ServerClock, script_input

    rule = rules.make(algorithm)
    sha = client.script_load(MINIMAL[algorithm])
    inputs = []
    for address in addrs:
        keys, _ = script_input([Check(rule, f"ip:{address}")], False, ServerClock())
        inputs.append((1, keys[0], *minimal_args(rule)))
    return Case("minimal script", sha, inputs)


def variant_case(client: Any, source: str, one: Case) -> Case:
    """Another version of decide.lua, on the same inputs as the package's 1-check case (its own
    keys: a prefix of its own, so each version counts on its own state)."""
    sha = client.script_load(source)
    inputs = [(n, *(f"v:{k}" for k in args[:n]), *args[n:]) for n, *args in one.inputs]
    return Case("decide.lua (--against), 1 check", sha, inputs)


def admitted(reply: Any) -> bool:
    """A reply of decide.lua (packed doubles) that admitted the request, or a minimal script's."""
    if not isinstance(reply, bytes):
        return True
    from django_throttle.store.redis import unpacked

    return unpacked(reply)[1] == 1


def run(client: Any, case: Case, start: int, calls: int) -> None:
    """``calls`` EVALSHAs from call number ``start``, one at a time, as requests send them."""
    inputs, n, execute = case.inputs, len(case.inputs), client.execute_command
    for i in range(start, start + calls):
        execute("EVALSHA", case.sha, *inputs[i % n])


def measure(client: Any, cases: list[Case], rounds: int, per_round: int) -> None:
    """Each case once per client untimed (its states written), then ``rounds`` turns of
    ``per_round`` calls per case from a rotating first case, each turn's server time read
    from commandstats, reset before it."""
    for case in cases:
        reply = client.execute_command("EVALSHA", case.sha, *case.inputs[0])
        assert admitted(reply), f"{case.name}: not admitted ({reply!r})"
        run(client, case, 1, len(case.inputs) - 1)
    start = 0
    for turn in range(rounds):
        k = turn % len(cases)
        for case in (*cases[k:], *cases[:k]):
            client.config_resetstat()
            run(client, case, start, per_round)
            stats = client.info("commandstats")
            evalsha = stats["cmdstat_evalsha"]
            assert evalsha["calls"] == per_round, (case.name, evalsha)
            failed = sum(
                s.get("failed_calls", 0) + s.get("rejected_calls", 0) for s in stats.values()
            )
            assert not failed, f"{case.name}: {failed} failed calls ({stats})"
            case.usec += evalsha["usec"]
            case.calls += evalsha["calls"]
            for name, s in stats.items():
                command = name.removeprefix("cmdstat_")
                if command not in ("evalsha", "config|resetstat", "info"):
                    case.commands[command] += s["calls"]
        start += per_round
    for case in cases:  # the last call of each case is admitted too
        reply = client.execute_command("EVALSHA", case.sha, *case.inputs[0])
        assert admitted(reply), f"{case.name}: not admitted ({reply!r})"


class CallgrindServer(harness.RedisServer):
    """The bench's redis-server under valgrind's callgrind, which counts the instructions run
    inside evalGenericCommand (EVALSHA) only; zeroed and read between cases."""

    def command(self) -> list[str]:
        if shutil.which("valgrind") is None:
            raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
        args = ["valgrind", "--tool=callgrind", "--toggle-collect=evalGenericCommand"]
        return [*args, f"--callgrind-out-file={self.dir}/callgrind.out", *super().command()]

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


def count_instructions(client: Any, server: CallgrindServer, cases: list[Case], calls: int) -> None:
    """Per case, a call per client (its states written, right before: under valgrind a bucket
    would drain), then ``calls`` calls counted: ``usec`` holds the instructions, so ``us`` is
    instructions per call."""
    for case in cases:
        run(client, case, 0, len(case.inputs))
        client.config_resetstat()
        server.control("-z")
        run(client, case, len(case.inputs), calls)
        case.usec, case.calls = server.counted(), calls
        for name, stat in client.info("commandstats").items():
            command = name.removeprefix("cmdstat_")
            if command not in ("evalsha", "config|resetstat", "info"):
                case.commands[command] += stat["calls"]
    for case in cases:  # every state there for the table of shapes, as measure() leaves them
        reply = client.execute_command("EVALSHA", case.sha, *case.inputs[0])
        assert admitted(reply), f"{case.name}: not admitted ({reply!r})"


def shape(client: Any, key: str) -> str:
    """What a client's state holds, digits aside, under its state key (a window's key ends with
    ``:<window>``): ``string # (int, 56 B), TTL``; ``zset of 20 (...)``; one entry per key."""
    found = []
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", key) + "*"
    for name in sorted(client.scan_iter(match=pattern, count=1000)):
        if name.endswith(b":b"):
            continue  # a block key
        kind = client.type(name).decode()
        if kind == "string":
            held = re.sub(rb"\d+", b"#", client.get(name)).decode()
        elif kind == "zset":
            held = f"of {client.zcard(name)}"
        else:
            held = ""
        encoding = client.object("encoding", name).decode()
        size = client.memory_usage(name, samples=0)
        ttl = "TTL" if client.pttl(name) > 0 else "no TTL"
        found.append(f"{kind} {held} ({encoding}, {size} B), {ttl}".replace("  ", " "))
    return "; ".join(found) or "none"


# -- main ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="2 rounds x 1000 calls per case, 200 clients"
    )
    parser.add_argument(
        "--instructions", action="store_true", help="CPU instructions per call (callgrind)"
    )
    parser.add_argument("--against", help="another decide.lua to time beside the package's")
    args = parser.parse_args()
    rounds, per_round, n_clients = (2, 1000, 200) if args.quick else (5, 4000, 1000)
    global UNIT
    if args.instructions:
        UNIT, n_clients = "Ir", 300
    started = time.monotonic()
    server_class = CallgrindServer if args.instructions else harness.RedisServer
    with server_class(cpu=harness.CPU) as server:
        harness.pin_client(harness.CPU)
        harness.configure_django(server.url)  # the key prefix and the store's settings
        import redis

        client = redis.Redis.from_url(server.url, socket_timeout=10)
        addrs = harness.addresses(n_clients)
        rules = Rules()
        floor = Case("return 1", client.script_load("return 1"), [(0,)])
        cases = {
            algorithm: [
                *(decide_case(client, rules, algorithm, n, addrs) for n in CHECKS),
                minimal_case(client, rules, algorithm, addrs),
            ]
            for algorithm in ALGORITHMS
        }
        variants = {}
        if args.against:
            with open(args.against, encoding="utf-8") as file:
                source = file.read()
            variants = {a: variant_case(client, source, group[0]) for a, group in cases.items()}
        everything = [
            floor,
            *(c for group in cases.values() for c in group),
            *variants.values(),
        ]
        harness.print_machine()
        if UNIT == "Ir":
            how = f"CPU instructions per call (callgrind, 300 calls per case, {n_clients} clients)"
        else:
            how = (
                f"server time per call ({rounds} x {per_round} calls per case, {n_clients} "
                f"clients, INFO commandstats)"
            )
        print(f"\n## decide.lua beside a minimal script, {how}\n", flush=True)
        if isinstance(server, CallgrindServer):
            count_instructions(client, server, everything, 300)
        else:
            measure(client, everything, rounds, per_round)

        rows = []
        for algorithm, (one, three, five, minimal) in cases.items():
            ratio = one.us / minimal.us
            target = RATIO_TARGET[algorithm]
            extra = (five.us - one.us) / (CHECKS[2] - CHECKS[0])
            verdicts = [
                f"ratio {'met' if ratio <= target else 'not met'}",
                f"extra {'met' if extra <= minimal.us else 'not met'}",
            ]
            rows.append(
                (
                    algorithm,
                    f"{one.us:.2f}",
                    f"{three.us:.2f}",
                    f"{five.us:.2f}",
                    f"{minimal.us:.2f}",
                    f"{ratio:.2f}x (≤ {target}x)",
                    f"{extra:.2f}",
                    f"{extra / minimal.us:.2f}x",
                    ", ".join(verdicts),
                )
            )
        harness.table(
            (
                "algorithm",
                f"decide.lua 1 check {UNIT}",
                f"3 checks {UNIT}",
                f"5 checks {UNIT}",
                f"minimal {UNIT}",
                "1 check / minimal",
                f"extra check {UNIT}",
                "extra / minimal (≤ 1.00x)",
                "targets",
            ),
            rows,
        )
        print(f"\n`return 1`: {floor.us:.2f} {UNIT} per call.")
        if variants:
            print(f"\n## {args.against} beside the package's decide.lua, 1 check\n")
            harness.table(
                (
                    "algorithm",
                    f"package {UNIT}",
                    f"--against {UNIT}",
                    "--against / package",
                    "/ minimal",
                ),
                [
                    (
                        a,
                        f"{cases[a][0].us:.2f}",
                        f"{v.us:.2f}",
                        f"{v.us / cases[a][0].us:.2f}x",
                        f"{v.us / cases[a][-1].us:.2f}x",
                    )
                    for a, v in variants.items()
                ],
            )

        print("\n## Redis commands per call and state left: decide.lua (1 check), minimal\n")
        rows = []
        for algorithm, group in cases.items():
            one, minimal = group[0], group[-1]
            key_decide = one.inputs[0][1]
            key_minimal = minimal.inputs[0][1]
            rows.append(
                (
                    algorithm,
                    one.per_call(),
                    minimal.per_call(),
                    shape(client, key_decide),
                    shape(client, key_minimal),
                )
            )
        harness.table(
            ("algorithm", "decide.lua", "minimal", "state (decide.lua)", "state (minimal)"),
            rows,
        )
    print(f"\nRun time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
