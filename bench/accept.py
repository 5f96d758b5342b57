"""What choosing a 429's body costs for hostile Accept headers (docs/bounds.md, "What a 429
reads of Accept")."""

from __future__ import annotations

import time

import harness

NOISE = "text/x-a;q=0.1"
CASES = {
    "a browser's (text/html,application/xhtml+xml,...)": (
        "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    ),
    "180,000 ranges, JSON last": ", ".join([NOISE] * 180_000) + ", application/json",
    "one range of 8 KB": "text/x-a;p=" + "x" * 8192,
    "4 KB of parameters (;a=b...)": "text/html" + ";a=b" * 1100,
    "32 ranges with a 120-byte parameter each": ",".join(["text/x;a=" + "y" * 120] * 40),
}


def main() -> None:
    harness.pin_client(harness.CPU)
    harness.configure_django("redis://127.0.0.1:1/0")  # no store call: nothing is decided
    from django.test import RequestFactory

    from django_throttle.responses import _negotiated, body_type

    factory = RequestFactory()
    rows = []
    for name, accept in CASES.items():
        request = factory.get("/", HTTP_ACCEPT=accept)
        new, again = [], []
        for _ in range(50):
            _negotiated.cache_clear()
            for samples in (new, again):
                started = time.perf_counter_ns()
                chosen = body_type(request)
                samples.append(time.perf_counter_ns() - started)
        rows.append(
            (
                name,
                f"{len(accept):,}",
                f"{harness.median(new) / 1000:.1f}",
                f"{harness.median(again) / 1000:.1f}",
                chosen,
            )
        )
    harness.print_machine()
    print("\n## Choosing a 429's body (responses.body_type), median of 50\n")
    harness.table(("Accept", "characters", "µs, a header not seen", "µs, again", "body"), rows)


if __name__ == "__main__":
    main()
