"""A hostile path against a regex scope, RE2 beside Python's re (docs/bounds.md, "Regular-expression
scopes")."""

from __future__ import annotations

import argparse
import multiprocessing
import re
import time
from collections.abc import Callable
from typing import Any

import harness

LENGTHS = (28, 255, 1024, 8192)
FAMILY = "^/" + "(?:a|)" * 26 + "a" * 26 + "$"


def run_of(char: str, end: str = "!") -> Callable[[int], str]:
    return lambda n: ("/" + char * n)[: n - len(end)] + end


CASES: list[tuple[str, str, Callable[[int], str]]] = [
    # label, pattern, path of a given length
    ("issue 20 row 1: (?:a|)x26 a{26}", FAMILY, run_of("a")),
    ("(a+)+$", r"^/(a+)+$", run_of("a")),
    ("(a|aa)*$", r"^/(a|aa)*$", run_of("a")),
    ("(.*a){20}", r"^/(.*a){20}", lambda n: ("/" + "a" * 19 + "b" * n)[:n]),
    (r"(\w+\s?)*$", r"^/(\w+\s?)*$", run_of("a")),
    ("(a?(b?(c?)?)?)*d$", r"^/(a?(b?(c?)?)?)*d$", run_of("abc")),
    (r"\d+\d+\d+x$", r"^/\d+\d+\d+x$", run_of("1", "y")),
    (r"users/\d+/$ (usual)", r"^/users/\d+/$", lambda n: ("/users/" + "1" * n)[: n - 1] + "x"),
]


def per_match(match: Callable[[str], Any], path: str, budget: float = 0.05) -> float:
    """Seconds per call, over as many calls as fit in ``budget``."""
    calls, started = 0, time.perf_counter()
    while True:
        match(path)
        calls += 1
        elapsed = time.perf_counter() - started
        if elapsed >= budget:
            return elapsed / calls


def _python_re(pattern: str, path: str, out: Any) -> None:
    compiled = re.compile(pattern)
    match = compiled.fullmatch if pattern.endswith("$") else compiled.search
    out.put(per_match(match, path, budget=0.02))


def python_re(pattern: str, path: str, cap: float) -> float | None:
    """Seconds per match of Python's re, or None past ``cap`` (a C loop cannot be interrupted,
    so it runs in a child process that is stopped)."""
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_python_re, args=(pattern, path, out), daemon=True)
    child.start()
    child.join(cap)
    if child.is_alive():
        child.terminate()
        child.join()
        return None
    return float(out.get())


def cell(text: str) -> str:
    return text.replace("|", "\\|")  # a pattern's | inside a Markdown table


def show(seconds: float | None, cap: float) -> str:
    if seconds is None:
        return f"> {cap:g} s (stopped)"
    if seconds >= 0.001:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1e6:.2f} µs"


def shapes(cap: float) -> None:
    from django_throttle import patterns

    rows = []
    for label, pattern, make_path in CASES:
        matcher = patterns.compile_scope(pattern)
        stopped = False
        for n in LENGTHS:
            path = make_path(n)
            assert len(path) == n, (label, n, len(path))
            verdict = matcher(path)
            plain = None if stopped else python_re(pattern, path, cap)
            stopped = stopped or plain is None
            rows.append(
                (cell(label), n, show(per_match(matcher, path), cap), show(plain, cap), verdict)
            )
    print("\n## One scope: RE2 (the scope's matcher) against Python's re\n")
    harness.table(("pattern", "path length", "RE2 per match", "re per match", "in scope"), rows)


def sets() -> None:
    from django_throttle import patterns

    rows = []
    for count in (10, 100, 1000):
        scopes = [rf"^/api/v\d+/resource{i}/[^/]+/$" for i in range(count)]
        singles = [patterns.compile_scope(s) for s in scopes]
        match_all = patterns.compile_scope_set(scopes, singles)
        for n in (28, 1024):
            path = ("/api/v1/resource7/" + "x" * n)[: n - 1] + "/"
            assert match_all(path) == [i for i, m in enumerate(singles) if m(path)]
            one_set = per_match(match_all, path)
            one_by_one = per_match(lambda p, ms=singles: [m(p) for m in ms], path)
            rows.append((count, n, show(one_set, 0), show(one_by_one, 0)))
    print("\n## N regex scopes: one RE2 set against N matchers tried one by one\n")
    harness.table(("regex scopes", "path length", "one set", "one by one"), rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cap", type=float, default=1.0, help="seconds given to Python's re")
    args = parser.parse_args()
    from django.conf import settings

    settings.configure()
    harness.print_machine("google-re2")
    shapes(args.cap)
    sets()


if __name__ == "__main__":
    main()
