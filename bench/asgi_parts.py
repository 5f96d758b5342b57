"""Where ThrottleMiddleware's time goes under ASGI beside WSGI: the medians of its parts, timed
inside requests (docs/benchmarks.md, "The middleware end to end").

The same parts are timed in three settings, taking turns in one run: a request through
``WSGIHandler``; the same with the CPU's caches evicted before it (untimed), as a large request
would leave them; a request through ``ASGIHandler``. Each part is the same code with the same
arguments in all three."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

import asgi
import harness

SETTINGS = ("WSGI", "WSGI, caches evicted", "ASGI")
# (module, function): the middleware's own parts, then its whole process_view, sync and async.
PARTS = (
    ("django_throttle.engine.flows", "gather"),
    ("django_throttle.store.redis", "packed_decide"),
    ("django_throttle.store.redis", "parse_reply"),
    ("django_throttle.engine.deciding", "_learn"),
    ("django_throttle.engine.flows", "settle"),
    ("django_throttle.engine.headers", "_written"),
)
WHOLE = (
    ("django_throttle.middleware", "enforce_view", "django_throttle.middleware", "aenforce_view"),
    ("django_throttle.store.guarded", "GuardedStore.decide", "", "GuardedStore.adecide"),
)


class Timed:
    """Medians of wrapped functions, per setting."""

    def __init__(self) -> None:
        self.setting = ""
        self.samples: dict[tuple[str, str], list[int]] = {}

    def add(self, name: str, ns: int) -> None:
        self.samples.setdefault((self.setting, name), []).append(ns)

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        func = getattr(owner, attr)
        clock = time.perf_counter_ns

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return func(*args, **kwargs)
            finally:
                self.add(name, clock() - start)

        setattr(owner, attr, timed)

    def awrap(self, owner: Any, attr: str, name: str) -> None:
        func = getattr(owner, attr)
        clock = time.perf_counter_ns

        async def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return await func(*args, **kwargs)
            finally:
                self.add(name, clock() - start)

        setattr(owner, attr, timed)

    def median_us(self, setting: str, name: str) -> float | None:
        values = self.samples.get((setting, name))
        return harness.median(values) / 1000 if values else None


def owner_of(module: str, dotted: str) -> tuple[Any, str]:
    import importlib

    obj: Any = importlib.import_module(module)
    *path, attr = dotted.split(".")
    for part in path:
        obj = getattr(obj, part)
    return obj, attr


def instrument(timed: Timed) -> None:
    for module, name in PARTS:
        timed.wrap(*owner_of(module, name), name)
    (sync_mod, sync_name, _, async_name), (store_mod, decide, _, adecide) = WHOLE
    timed.wrap(*owner_of(sync_mod, sync_name), "process_view")
    timed.awrap(*owner_of(sync_mod, async_name), "process_view")
    timed.wrap(*owner_of(store_mod, decide), "store call")
    timed.awrap(*owner_of(store_mod, adecide), "store call")


def evictor(size: int = 8 << 20) -> Callable[[], None]:
    """Touch ``size`` bytes and some Python: what a large request leaves the caches like."""
    import json

    junk = bytearray(size)
    zeros = bytes(len(junk[::64]))
    text = json.dumps([{"a": list(range(50))}] * 200)

    def evict() -> None:
        junk[::64] = zeros
        json.loads(text)

    return evict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--per-round", type=int, default=500)
    args = parser.parse_args()
    timed = Timed()
    with harness.RedisServer(cpu=harness.CPU) as server:
        harness.pin_client(harness.CPU)
        harness.configure_site(server.url, asgi.__name__, database=asgi.DATABASE)
        asgi.urls()
        harness.create_rules([("*", "sliding_window_counter", 10**9, "hour")])
        instrument(timed)  # before the handlers are made: they bind process_view then
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        wsgi = asgi.wsgi_case("wsgi", True, "/p/")
        asgi_ = asgi.asgi_case("asgi", True, "/p/", loop)
        evict = evictor()
        for case in (wsgi, asgi_):
            for i in range(1000):
                case.op(case.prep(i))
        timed.samples.clear()
        harness.print_machine()
        try:
            for _ in range(args.rounds):
                for setting, case in zip(SETTINGS, (wsgi, wsgi, asgi_), strict=True):
                    timed.setting = setting
                    for i in range(args.per_round):
                        arg = case.prep(i)
                        if setting == SETTINGS[1]:
                            evict()
                        case.op(arg)
        finally:
            loop.close()
    print(
        f"\n## ThrottleMiddleware's parts inside requests, medians in µs ({args.rounds} x "
        f"{args.per_round} requests per setting, one `*` rule)\n"
    )
    names = [name for _, name in PARTS] + ["store call", "process_view"]
    rows = []
    for name in names:
        figures = [timed.median_us(s, name) for s in SETTINGS]
        base = figures[0]
        cells = [f"{f:.1f}" if f is not None else "-" for f in figures]
        ratio = figures[2] / base if base and figures[2] else None
        rows.append((name, *cells, f"{ratio:.2f}x" if ratio else "-"))
    harness.table(("part", *SETTINGS, "ASGI / WSGI"), rows)


if __name__ == "__main__":
    main()
