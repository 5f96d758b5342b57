"""What reading a rule file costs throttle_import (docs/bounds.md, "Rule files")."""

from __future__ import annotations

import copy
import json
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import harness

FIRST = "rules:\n  - {name: first, scope: /first/, limit: 5}\n"
LAUGHS = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"{b}: &{b} [{','.join([f'*{a}'] * 9)}]\n"
        for a, b in zip("abcdefgh", "bcdefghi", strict=True)
    )
    + "rules:\n  - {name: laughs, scope: /laughs/, limit: 1, exempt_networks: *i}\n"
)


def hostile(max_bytes: int, max_values: int) -> list[tuple[str, str, bytes]]:
    deep = "[" * 100_000 + "]" * 100_000
    many = "[" + "0," * max_values + "0]"
    slow = [
        (f"{max_values + 1:,} values", "yaml", ("rules: " + many + "\n").encode()),
        (f"{max_values + 1:,} values", "json", ('{"rules": ' + many + "}").encode()),
    ]
    return [
        ("not UTF-8", "yaml", FIRST.encode() + b"  - {name: caf\xe9}\n"),
        ("lone surrogate", "json", b'{"rules": [{"name": "a", "scope": "/\\ud800/"}]}'),
        ("NUL", "yaml", (FIRST + '  - {name: s, scope: "/\\0/"}\n').encode()),
        ("billion laughs", "yaml", LAUGHS.encode()),
        ("merge key", "yaml", (FIRST + "  - {name: s, <<: {limit: 5}}\n").encode()),
        ("100,000 deep", "json", ('{"rules": ' + deep + "}").encode()),
        ("100,000 deep", "yaml", ("rules: " + deep + "\n").encode()),
        ("100,000 digits", "json", ('{"rules": [{"limit": ' + "7" * 100_000 + "}]}").encode()),
        ("100,000 digits", "yaml", (FIRST + "  - {limit: " + "7" * 100_000 + "}\n").encode()),
        ("1e999", "json", b'{"rules": [{"name": "s", "limit": 1e999}]}'),
        ("NaN", "json", b'{"rules": [{"name": "s", "limit": NaN}]}'),
        ("over the size cap", "yaml", b"rules: []\n" + b" " * max_bytes),
    ] + (slow if "--slow" in sys.argv else [])


def ten_thousand() -> dict[str, Any]:
    rule = {
        "scope": "/api/v1/",
        "methods": "",
        "key_kind": "ip",
        "key_arg": "",
        "limit": 100,
        "per": 1,
        "unit": "minute",
        "algorithm": "sliding_window_counter",
        "burst": None,
        "block_seconds": 0,
        "action": "reject",
        "fail_mode": "default",
        "applies_to": "all",
        "exempt_staff": False,
        "exempt_networks": [],
        "enabled": True,
        "groups": [],
        "exempt_groups": [],
        "overrides": [],
    }
    # Fresh lists per rule, as export_rules() makes them (shared ones would be dumped as
    # anchors and aliases, which a rule file refuses).
    return {"rules": [{"name": f"rule-{i}", **copy.deepcopy(rule)} for i in range(10_000)]}


def measured(call: Callable[[], Any]) -> tuple[float, float, str]:
    """Seconds (best of 3 for a quick call), peak MiB, and the error's message if any."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        outcome = _outcome(call)
        best = min(best, time.perf_counter() - started)
        if best > 0.5:
            break
    tracemalloc.start()
    try:
        _outcome(call)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    return best, peak, outcome


def _outcome(call: Callable[[], Any]) -> str:
    from django_throttle.management.rulefiles import RuleFileError

    try:
        call()
    except RuleFileError as exc:
        message = str(exc).replace("\n", " ")
        return message if len(message) <= 70 else message[:67] + "..."
    return "read"


def main() -> None:
    harness.configure_django("redis://127.0.0.1:1/0", apps=["django_throttle"])
    import yaml

    from django_throttle.management import rulefiles

    harness.print_machine("PyYAML")
    print(f"\nlibyaml: {'yes' if yaml.__with_libyaml__ else 'no'}")

    print("\n## Hostile files, each refused\n")
    rows = []
    for kind, fmt, raw in hostile(rulefiles.MAX_FILE_BYTES, rulefiles.MAX_VALUES):
        seconds, peak, message = measured(lambda raw=raw, fmt=fmt: rulefiles.parse(raw, fmt))
        rows.append((kind, fmt, f"{len(raw):,}", f"{seconds * 1000:.1f}", f"{peak:.1f}", message))
    harness.table(("file", "format", "bytes", "ms", "peak MiB", "refused with"), rows)

    print("\n## 10,000 well-formed rules (every field), read\n")
    data = ten_thousand()
    files = [
        ("YAML, libyaml", "yaml", yaml.safe_dump(data, sort_keys=False).encode()),
        ("JSON", "json", json.dumps(data, indent=2).encode()),
    ]
    rows = []
    for label, fmt, raw in files:
        seconds, peak, message = measured(lambda raw=raw, fmt=fmt: rulefiles.parse(raw, fmt))
        rows.append((label, f"{len(raw) / 2**20:.1f}", f"{seconds:.2f}", f"{peak:.0f}", message))
    if "--slow" in sys.argv:
        raw = files[0][2]
        c_loader = yaml.CSafeLoader
        del yaml.CSafeLoader  # as installed without libyaml
        try:
            seconds, peak, message = measured(lambda: rulefiles.parse(raw, "yaml"))
        finally:
            yaml.CSafeLoader = c_loader
        rows.append(
            (
                "YAML, pure Python",
                f"{len(raw) / 2**20:.1f}",
                f"{seconds:.2f}",
                f"{peak:.0f}",
                message,
            )
        )
        text = raw.decode()
        seconds, peak, message = measured(lambda: yaml.safe_load(text))
        rows.append(
            (
                "YAML, yaml.safe_load (before)",
                f"{len(text) / 2**20:.1f}",
                f"{seconds:.2f}",
                f"{peak:.0f}",
                message,
            )
        )
    harness.table(("file", "MiB", "s", "peak MiB", "outcome"), rows)


if __name__ == "__main__":
    main()
