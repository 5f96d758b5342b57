"""The sliding log's server time per decision at 10k to 320k entries (docs/bounds.md, "The sliding
log's work per decision")."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import harness

DAY = 86400
US = 1_000_000
LIMIT = 1_000_000
IDENTITY = "ip:198.18.0.1"
ROUNDS = 5  # per case and version: the median is printed


def build(client: Any, key: str, entries: list[tuple[int, int]]) -> None:
    """(time µs, units) per request as decide.lua logs them: the microsecond and a 3-digit
    sequence, "x<units>" when costly, and the tally "#" of their extra units."""
    client.delete(key)
    extra = sum(units - 1 for _, units in entries)
    pipe = client.pipeline(transaction=False)
    for start in range(0, len(entries), 10_000):
        chunk = entries[start : start + 10_000]
        pipe.zadd(key, {f"{at}000" + (f"x{u}" if u > 1 else ""): at for at, u in chunk})
    if extra:
        pipe.zadd(key, {"#": -extra})
    pipe.pexpire(key, DAY * 1000)
    pipe.execute()


def server_now(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * US + int(micros)


def live_log(client: Any, m: int, spare: int) -> list[tuple[int, int]]:
    """M - 1 entries of one unit over the last hour, the newest with the limit's units but
    ``spare``."""
    now = server_now(client)
    step = 3598 * US // m
    entries = [(now - 3600 * US + i * step, 1) for i in range(m - 1)]
    entries.append((now - US, LIMIT - spare - (m - 1)))
    return entries


def dead_log(client: Any, m: int) -> list[tuple[int, int]]:
    """M entries that expired a moment ago (every tenth of 5 units), 1,000 live ones."""
    now = server_now(client)
    step = 3600 * US // m
    dead = [(now - (DAY + 3600) * US + i * step, 5 if i % 10 == 0 else 1) for i in range(m)]
    return dead + [(now - 60 * US + i, 1) for i in range(1000)]


def timed(client: Any, sha: str, keys: list[str], args: list[Any], once: bool) -> tuple[float, Any]:
    """Server µs per EVALSHA (commandstats) over up to 100 calls (0.3 s at most), and the last
    reply."""
    client.config_resetstat()
    started = time.monotonic()
    reply = None
    for _ in range(1 if once else 100):
        reply = client.execute_command("EVALSHA", sha, len(keys), *keys, *args)
        if time.monotonic() - started > 0.3:
            break
    stats = client.info("commandstats")["cmdstat_evalsha"]
    return stats["usec"] / stats["calls"], reply


def rounds(
    client: Any, sha: str, keys: list[str], args: list[Any], log: Any, once: bool, admit: bool
) -> float:
    """The median of ROUNDS rounds (fewer once a version has taken 2 s): a round builds the
    log (a case that changes it: every round; else the first) and times its calls."""
    per_round: list[float] = []
    started = time.monotonic()
    for n in range(ROUNDS):
        if once or n == 0:
            build(client, keys[0], log())
        us, reply = timed(client, sha, keys, args, once)
        assert reply is not None and (reply[1] == 1) == admit, reply
        per_round.append(us)
        if time.monotonic() - started > 2:
            break
    return statistics.median(per_round)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", help="another decide.lua to time beside the package's")
    parser.add_argument("--sizes", default="10000,100000,320000", help="log sizes, comma-separated")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    started = time.monotonic()
    with harness.RedisServer(cpu=harness.CPU) as server:
        harness.pin_client(harness.CPU)
        harness.configure_django(server.url)
        import redis

        from django_throttle.store import Check
        from django_throttle.store.redis import DECIDE_SOURCE, ServerClock, script_input

        client = redis.Redis.from_url(server.url, socket_timeout=60)
        versions = {"package": client.script_load(DECIDE_SOURCE)}
        if args.against:
            with open(args.against, encoding="utf-8") as file:
                versions["--against"] = client.script_load(file.read())
        rule = harness.make_rule(1, "sliding_window_log", LIMIT, DAY)
        harness.print_machine()
        print(
            "\n## decide.lua on a sliding log of 1,000,000 a day, server time per call "
            "(INFO commandstats)\n",
            flush=True,
        )

        def inputs(cost: int) -> tuple[list[str], list[Any]]:
            return script_input([Check(rule, IDENTITY, cost)], False, ServerClock())

        rows = []
        for m in sizes:
            cases = [
                (f"rejected, cost {m - 1:,}", lambda m=m: live_log(client, m, 0), m - 1, False),
                ("admitted, cost 1", lambda m=m: live_log(client, m, 1000), 1, False),
                (f"admitted, {m:,} dead", lambda m=m: dead_log(client, m), 1, True),
            ]
            for name, log, cost, once in cases:
                keys, argv = inputs(cost)
                admit = not name.startswith("rejected")
                row: list[Any] = [f"{m:,}", name]
                for sha in versions.values():
                    us = rounds(client, sha, keys, argv, log, once, admit)
                    row.append(f"{us:,.0f}" if us >= 100 else f"{us:.1f}")
                rows.append(row)
        harness.table(
            ("entries", "decision", *(f"{v} µs" for v in versions)),
            rows,
        )
    print(f"\nRun time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
