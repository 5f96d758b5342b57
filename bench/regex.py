"""What a hostile path costs a regular-expression scope: Python's re unbounded (as before),
the scope matcher without RE2 (re on the first 1,024 characters) and with RE2.

    .venv/bin/python bench/regex.py

Run from the repository root. Each pattern is timed on a path built to make it backtrack (a
long run of what it repeats, then a character that fails the match). Patterns marked refused
are what validation now rejects; they are timed with Python's re only, at lengths where that
still ends, to show why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import harness

CASES = [
    # pattern, repeated character, lengths for the unbounded re
    (r"^/(a+)+$", "a", (16, 20, 24)),
    (r"^/\d+\d+\d+x$", "1", (256, 512, 1024)),
    (r"^/users/\d+\d+/$", "1", (1024, 10_000, 50_000)),
    (r"^/files/.+\.pdf$", "x", (1024, 10_000, 50_000)),
]


def timed(match: Callable[[str], Any], path: str) -> float:
    started = time.perf_counter()
    match(path)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    import re

    from django.conf import settings

    settings.configure()
    from django_throttle import patterns

    harness.print_machine("google-re2")
    rows = []
    for pattern, char, lengths in CASES:
        prefix = "/users/" if "users" in pattern else "/files/" if "files" in pattern else "/"
        try:
            patterns.check_pattern(pattern)
            refused = ""
        except patterns.UnsafePattern as exc:
            refused = str(exc).split(";")[0].split("(")[0].strip()
        for n in lengths:
            path = prefix + char * n + "!"
            plain = timed(re.compile(pattern).match, path)
            if refused:
                rows.append((pattern, n, f"{plain:.2f}", "refused", "refused", refused))
                continue
            re2_module = patterns.re2
            patterns.re2 = None
            capped = patterns.compile_scope(pattern)
            patterns.re2 = re2_module
            linear = patterns.compile_scope(pattern) if re2_module is not None else None
            rows.append(
                (
                    pattern,
                    n,
                    f"{plain:.2f}",
                    f"{timed(capped, path):.2f}",
                    f"{timed(linear, path):.3f}" if linear else "not installed",
                    "accepted",
                )
            )
    harness.table(
        ("pattern", "path length", "re ms", "scope, re capped ms", "scope, RE2 ms", "validation"),
        rows,
    )


if __name__ == "__main__":
    main()
