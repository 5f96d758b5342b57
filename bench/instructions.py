"""The Python around a decision in CPU instructions (docs/benchmarks.md, "The Python around a
decision, in instructions")."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import harness

SMALL, LARGE = 500, 2500


def calls(n: int, rules: int, middleware: bool) -> None:
    """Make ``n`` decisions and nothing else (what valgrind counts)."""
    with harness.RedisServer() as server:
        if middleware:
            import e2e

            harness.configure_site(server.url, "e2e")
            e2e.urls()
            harness.create_rules([("*", "fixed_window", 10**9, "hour")] * rules)
            case = harness.request_case("counted", e2e.handler(throttled=rules > 0), "/p/")
            for i in range(n):
                case.op(case.prep(i))
            return
        from engine import request, setup

        setup(server.url, migrate=True)
        harness.create_rules([("s", "fixed_window", 10**9, "hour")] * rules)
        from django_throttle import check

        addrs = harness.addresses(1000)
        for r in [request(addrs[i % 1000]) for i in range(n)]:
            assert check(r, "s").allowed


def counted(n: int, rules: int, middleware: bool) -> int:
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    command += [sys.executable, __file__, "--calls", str(n), "--rules", str(rules)]
    command += ["--middleware"] if middleware else []
    env = {**os.environ, "PYTHONMALLOC": "malloc"}
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stderr
    return int(re.findall(r"Collected : (\d+)", out)[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rules", type=int, default=1)
    parser.add_argument("--middleware", action="store_true")
    parser.add_argument("--calls", type=int, help=argparse.SUPPRESS)  # the counted child
    args = parser.parse_args()
    if args.calls is not None:
        calls(args.calls, args.rules, args.middleware)
        return
    import django_throttle

    small, large = (counted(n, args.rules, args.middleware) for n in (SMALL, LARGE))
    what = "request through the middleware" if args.middleware else "check()"
    per = (large - small) / (LARGE - SMALL)
    print(f"{django_throttle.__file__}: {per:,.0f} instructions per {what}, {args.rules} rule(s)")


if __name__ == "__main__":
    main()
