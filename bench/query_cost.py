"""What costing a GraphQL operation takes (docs/benchmarks.md, "GraphQL query cost"): the
default cost of ThrottleExtension on a 1,000-field query, with fragments and a list page."""

from __future__ import annotations

import argparse
import time

import harness
from graphql import parse

from django_throttle.contrib.graphql_cost import query_cost


def thousand_fields() -> str:
    """1,000 fields selected: 500 aliased scalars, 40 objects spreading a fragment of 10
    (440), a list of 59 fields paged by 50 (60)."""
    scalars = " ".join(f"f{n}: id" for n in range(500))
    spreads = " ".join(f"s{n}: me {{ ...F }}" for n in range(40))  # 40 x (1 + 10)
    fragment = "fragment F on User { " + " ".join(f"g{n}: id" for n in range(10)) + " }"
    page = "users(first: 50) { " + " ".join(f"h{n}: id" for n in range(59)) + " }"
    return f"{{ {scalars} {spreads} {page} }} {fragment}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    options = parser.parse_args()
    harness.pin_client()
    document = parse(thousand_fields())
    times = []
    for _ in range(options.runs):
        started = time.perf_counter()
        query_cost(document)
        times.append(time.perf_counter() - started)
    median = harness.median(times)
    print(f"costing a 1,000-field query (cost {query_cost(document)}), {options.runs} runs:")
    print(f"  median {median * 1e6:.1f} us, p99 {harness.p99(times) * 1e6:.1f} us")
    print(f"  target: a median of at most 1 ms -> {'PASS' if median <= 1e-3 else 'FAIL'}")


if __name__ == "__main__":
    main()
