"""django_throttle beside its peers: latency, memory, a race (docs/benchmarks.md, "Engine")."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import harness
from harness import HOUR, Case

PEERS = ("django-ratelimit", "djangorestframework", "limits")
RATES = ((10_000, "hour"), (1_000, "minute"), (100_000, "day"), (100, "second"), (10**6, "day"))
PEER_RATES = ("10000/hour", "1000/minute", "100000/day")
MEMORY_ADMITS = 100
TIME_LIMIT = 290  # seconds: the run aborts after them
RACE_PROCS, RACE_ATTEMPTS, RACE_LIMIT = 8, 40, 50


def available(name: str) -> bool:
    """Ours, or a peer whose package is installed (bench/floor installs them all)."""
    first = name.split()[0]
    dist = "djangorestframework" if first == "DRF" else first
    return first == "django-throttle" or harness.version(dist) != "not installed"


def setup(url: str, migrate: bool = False) -> None:
    apps = ["rest_framework"] if available("DRF") else []
    harness.configure_django(url, [*apps, "django_throttle"], migrate)


def request(address: str) -> Any:
    """A fresh request (check() counts a request once, however often it is asked), with the
    anonymous user DRF's throttle looks at."""
    from django.contrib.auth.models import AnonymousUser
    from django.http import HttpRequest

    r = HttpRequest()
    r.method, r.path, r.user = "GET", "/api/", AnonymousUser()
    r.META["REMOTE_ADDR"] = address
    return r


Op = Callable[[Any], bool]  # one decision about a request: admitted?


def contender(name: str, url: str, tag: str, rates: Sequence[str], first_id: int = 1) -> Op:
    """A decision of ours on the store with compiled rules (``django-throttle <algorithm>`` or
    ``... 5 rules``, the first rate), or of a peer on its own connections; every rate counted."""
    if name.startswith("django-throttle"):
        from django_throttle.store import Check, get_store

        store, limit = get_store().backend(), int(rates[0].split("/")[0])
        algorithms = harness.algorithms() if name.endswith("5 rules") else [name.split()[1]]
        rules = [harness.make_rule(first_id + k, a, limit) for k, a in enumerate(algorithms)]
        return lambda r: all(
            x.allowed
            for x in store.decide([Check(u, f"ip:{r.META['REMOTE_ADDR']}") for u in rules])
        )
    if name == "django-ratelimit":
        from django_ratelimit.core import is_ratelimited

        groups = [(f"{tag}-{i}", rate) for i, rate in enumerate(rates)]
        return lambda r: (
            not sum(is_ratelimited(r, group=g, key="ip", rate=x, increment=True) for g, x in groups)
        )
    if name == "DRF AnonRateThrottle":
        from rest_framework.throttling import AnonRateThrottle

        throttle = type("Throttle", (AnonRateThrottle,), {"scope": tag, "rate": rates[0]})()
        return lambda r: throttle.allow_request(r, None)
    from limits import parse, strategies
    from limits.storage import RedisStorage

    storage = RedisStorage(url.rsplit("/", 1)[0])  # limits wants no database number
    limiter = getattr(strategies, f"{name.split()[1]}RateLimiter")(storage)
    items = [parse(rate) for rate in rates]
    return lambda r: sum(limiter.hit(x, tag, r.META["REMOTE_ADDR"]) for x in items) == len(items)


def latency_cases(url: str, n_clients: int) -> list[Case]:
    from django_throttle import check

    addrs = harness.addresses(n_clients)
    shared = [request(a) for a in addrs]
    cases = [
        harness.raw_evalsha(url),
        *(minimal_windows(url, addrs, n) for n in (1, 3, 5)),
        *(minimal_windows(url, addrs, n, counted=True) for n in (1, 3, 5)),
    ]
    ours = {
        f"{n} rule{'s' * (n > 1)} (fixed_window)": [("fixed_window", *RATES[i]) for i in range(n)]
        for n in (1, 3, 5)
    }
    ours |= {f"1 rule ({a})": [(a, *RATES[0])] for a in harness.algorithms() if a != "fixed_window"}
    for k, (label, rules) in enumerate(ours.items()):
        harness.create_rules([(f"s{k}", *rule) for rule in rules])

        def op(r: Any, scope: str = f"s{k}") -> bool:
            return check(r, scope).allowed

        cases.append(Case(f"django-throttle {label}", op, lambda i: request(addrs[i % n_clients])))
    peers = [("limits FixedWindow", 1), ("limits FixedWindow", 3), ("django-ratelimit", 1)]
    for name, n in [*peers, ("django-ratelimit", 3), ("DRF AnonRateThrottle", 1)]:
        if not available(name):
            continue
        op = contender(name, url, f"lat{n}", PEER_RATES[:n])
        label = name if name.startswith("DRF") else f"{name} {n} limit{'s' * (n > 1)}"
        cases.append(Case(label, op, lambda i: shared[i % n_clients]))
    return cases


# The fixed window's commands for N rules of one client and nothing else: TIME, then GET and
# SET "window:count" PX for each (bench/script.py's minimal fixed-window script, for N keys).
# ARGV: period (s), cost.
MINIMAL_WINDOWS = """
local t = redis.call('TIME')
local p = tonumber(ARGV[1])
local w = math.floor(t[1] / p)
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
for i = 1, #KEYS do
  local count = 0
  local v = redis.call('GET', KEYS[i])
  if v then
    local sw, sc = string.match(v, '^(%d+):(%d+)$')
    if tonumber(sw) == w then count = tonumber(sc) end
  end
  redis.call('SET', KEYS[i], string.format('%d:%d', w, count + ARGV[2]), 'PX',
    (w + 1) * p * 1000 - now_ms)
end
return 1
"""

# Issue 14's own hand-written fixed window: TIME, then INCRBY and PEXPIRE (to the window's end)
# for each key, a bare count with no window in it. It does less than a fixed window must (no
# limit compared, so a rejected request is counted too; a count left by another period or a
# clock step is not told apart), so no fixed window can cost less. ARGV: period (s), cost.
MINIMAL_COUNTS = """
local t = redis.call('TIME')
local p = tonumber(ARGV[1])
local ttl = (math.floor(t[1] / p) + 1) * p * 1000 - (t[1] * 1000 + math.floor(t[2] / 1000))
for i = 1, #KEYS do
  redis.call('INCRBY', KEYS[i], ARGV[2])
  redis.call('PEXPIRE', KEYS[i], ttl)
end
return 1
"""


def minimal_windows(url: str, addrs: list[str], n: int, counted: bool = False) -> Case:
    """The least N fixed-window rules can cost through redis-py: one EVALSHA of a script above
    (``counted``: INCRBY and PEXPIRE) on one client's state keys, no Python around it."""
    import redis

    from django_throttle.store.base import state_key

    client = redis.Redis.from_url(url, socket_timeout=1.0)
    sha = client.script_load(MINIMAL_COUNTS if counted else MINIMAL_WINDOWS)
    rules = [harness.make_rule(900 + k, "fixed_window", 10**9) for k in range(n)]
    keys = [[state_key(r, f"ip:{a}") + ("n" if counted else "") for r in rules] for a in addrs]
    commands = "INCRBY+PEXPIRE" if counted else "GET+SET"
    return Case(
        f"minimal script, {n} fixed window{'s' * (n > 1)}, {commands} (redis-py)",
        lambda i: client.evalsha(sha, n, *keys[i % len(keys)], HOUR, 1),
    )


# Issue 14's targets, through check(): at most these times the raw EVALSHA.
TARGETS = {
    "django-throttle 1 rule (fixed_window)": 1.2,
    "django-throttle 3 rules (fixed_window)": 1.4,
    "django-throttle 5 rules (fixed_window)": 1.6,
}


# Issue 24's targets: check() of N fixed-window rules against limits' FixedWindowRateLimiter
# hit() of N limits (N calls), both on the run's redis-server: at most these times its median.
AGAINST_LIMITS = (
    ("django-throttle 1 rule (fixed_window)", "limits FixedWindow 1 limit", 0.85),
    ("django-throttle 3 rules (fixed_window)", "limits FixedWindow 3 limits", 0.45),
)


def report_against_limits(cases: list[Case]) -> None:
    medians, rows = {c.name: c.median_us for c in cases}, []
    for ours, theirs, target in AGAINST_LIMITS:
        mine, peer = medians[ours], medians.get(theirs)
        row = [ours, f"{mine:.1f}", theirs, "-", "-", f"≤ {target:.2f}x", "limits not installed"]
        if peer is not None:
            row[3:5] = f"{peer:.1f}", f"{mine / peer:.2f}x"
            row[6] = "met" if mine / peer <= target else "not met"
        rows.append(row)
    harness.table(("ours", "µs", "limits", "µs", "ours / limits", "target", "verdict"), rows)


def report_latency(cases: list[Case]) -> None:
    raw, rows = cases[0].median_us, []
    for c in cases:
        ratio, target = c.median_us / raw, TARGETS.get(c.name)
        verdict = f"≤ {target:.1f}x: {'met' if ratio <= target else 'not met'}" if target else ""
        rows.append((c.name, f"{c.median_us:.1f}", f"{c.p99_us:.1f}", f"{ratio:.2f}x", verdict))
    harness.table(("case", "median µs", "p99 µs", "/ raw EVALSHA", "target"), rows)


def memory_floor(admin: Any, key_length: int) -> int:
    """MEMORY USAGE of the least a client's state can be: a string key this long, an int, a TTL."""
    key = "k" * key_length
    admin.set(key, 12345, px=3_600_000)
    try:
        return int(admin.memory_usage(key, samples=0))
    finally:
        admin.delete(key)


def report_memory(url: str) -> None:
    """The bytes, keys and longest key that 100 admits of one client leave in an empty database;
    for the sorted-set logs, the bytes per entry too (from 1 admit to 100); for one-key states,
    the floor of a string key with a TTL of the same length."""
    import redis

    admin = redis.Redis.from_url(url, decode_responses=True)
    names = [f"django-throttle {a}" for a in harness.algorithms()]
    names += ["limits FixedWindow", "limits MovingWindow", "django-ratelimit"]
    names += ["DRF AnonRateThrottle"]
    r = request("198.51.100.7")
    rows = []
    for name in filter(available, names):
        sizes = []
        for admits in (1, MEMORY_ADMITS):
            admin.flushall()
            op = contender(name, url, "mem", ["10000/hour"])  # rule id 1: the shortest key
            for _ in range(admits):
                assert op(r), name
            keys = list(admin.scan_iter(count=1000))
            sizes.append(sum(admin.memory_usage(k, samples=0) or 0 for k in keys))
        per_entry = (sizes[1] - sizes[0]) / (MEMORY_ADMITS - 1)
        log = name.endswith(("sliding_window_log", "MovingWindow", "concurrency"))
        longest = max(map(len, keys))
        floor = "-" if log or len(keys) != 1 else str(memory_floor(admin, longest))
        rows.append((name, len(keys), longest, sizes[1], f"{per_entry:.1f}" if log else "-", floor))
    admin.flushall()
    harness.table(("store", "keys", "key length", "bytes", "bytes per entry", "floor bytes"), rows)


def contenders() -> list[str]:
    ours = [f"django-throttle {a}" for a in harness.algorithms()]
    limits = [f"limits {s}" for s in ("FixedWindow", "MovingWindow", "SlidingWindowCounter")]
    peers = ["django-ratelimit", "DRF AnonRateThrottle", *limits]
    return [*ours, "django-throttle 5 rules", *filter(available, peers)]


def race_worker(url: str, tag: str, address: str, barrier: Any, results: Any) -> None:
    setup(url)
    r, rate = request(address), f"{RACE_LIMIT}/hour"
    for index, name in enumerate(contenders()):
        try:  # built in this process, on its own connections, and connected
            attempt: Op | None = contender(name, url, f"{tag}-{index}", [rate], 10_000 + 10 * index)
            attempt(request("192.0.2.1"))
            error = ""
        except Exception as exc:  # reported; the other processes are not left waiting
            attempt, error = None, f"{type(exc).__name__}: {exc}"
        barrier.wait(timeout=60)  # every process ready: go together
        admitted = sum(bool(attempt(r)) for _ in range(RACE_ATTEMPTS)) if attempt else 0
        results.put((name, admitted, error))


def race(url: str) -> list[tuple[str, str, str]]:
    left = HOUR - time.time() % HOUR  # our windows are aligned to the hour: not across one
    if left < 30:
        time.sleep(left + 1)
    address = "203.0.113.1"
    if available("django-ratelimit"):
        from django_ratelimit.core import _get_window

        # A client whose django-ratelimit window (jittered per key) does not end in the race.
        candidates = (f"203.0.113.{i}" for i in range(1, 250))
        address = next(a for a in candidates if _get_window(a, HOUR) - time.time() > 120)
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(RACE_PROCS), ctx.Queue()
    args = (url, uuid.uuid4().hex[:8], address, barrier, results)
    procs = [ctx.Process(target=race_worker, args=args, daemon=True) for _ in range(RACE_PROCS)]
    for p in procs:
        p.start()
    totals = dict.fromkeys(contenders(), 0)
    errors: dict[str, str] = {}
    try:
        for _ in range(RACE_PROCS * len(totals)):
            name, admitted, error = results.get(timeout=120)
            totals[name] += admitted
            if error:
                errors[name] = error
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
    rows = []
    for name, n in totals.items():
        off = f"{'over' if n > RACE_LIMIT else 'under'} by {abs(n - RACE_LIMIT)}"
        verdict = errors.get(name) or ("exact" if n == RACE_LIMIT else off)
        rows.append((name, f"{n}/{RACE_PROCS * RACE_ATTEMPTS}", verdict))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2 rounds x 300 calls, 200 clients")
    parser.add_argument("--no-race", action="store_true", help="skip the 8-process race")
    args = parser.parse_args()
    rounds, per_round, clients = (2, 300, 200) if args.quick else (5, 2000, 1000)
    signal.signal(signal.SIGALRM, lambda *_: sys.exit("aborted: past --time-limit"))
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    signal.alarm(TIME_LIMIT)
    started = time.monotonic()
    with harness.RedisServer(cpu=harness.CPU) as server:
        harness.pin_client(harness.CPU)
        setup(server.url, migrate=True)
        harness.print_machine(*PEERS)
        cases = latency_cases(server.url, clients)
        print(
            f"\n## Latency per decision ({rounds} x {per_round} calls per case, {clients} "
            f"clients, client and redis-server on CPU {harness.CPU})\n",
            flush=True,
        )
        harness.interleaved(cases, rounds, per_round, warmup=clients)
        report_latency(cases)
        print("\n## check() against limits' FixedWindowRateLimiter.hit() (same run, medians)\n")
        report_against_limits(cases)
        print(f"\n## Redis memory after {MEMORY_ADMITS} admits of one client (MEMORY USAGE)\n")
        report_memory(server.url)
        if not args.no_race:
            os.sched_setaffinity(0, range(os.cpu_count() or 1))  # the racers on every CPU
            print(
                f"\n## Race: {RACE_PROCS} processes x {RACE_ATTEMPTS} attempts, one client, "
                f"limit {RACE_LIMIT}/hour\n",
                flush=True,
            )
            harness.table(("contender", "admitted", f"vs {RACE_LIMIT}"), race(server.url))
    print(f"\nRun time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
