"""What exempt networks cost a request, with 10,000 and 100,000 CIDRs listed (docs/bounds.md,
"Exempt networks"; docs/benchmarks.md); and what 10,000 bans cost a client not banned."""

from __future__ import annotations

import argparse
import functools
import ipaddress
import time
from typing import Any

import harness

urlpatterns: list[Any] = []  # this module is the ROOT_URLCONF
SIZES = (10_000, 100_000)
# Disjoint client ranges, one per case: a "new" client is never one the caches saw.
PREFIXES = tuple(f"198.{n}" for n in range(18, 25))
DATABASE = "file:networks?mode=memory&cache=shared"  # one in memory for every thread


def networks(count: int) -> list[str]:
    """``count`` /30s spread over 100.0.0.0/8: no client of the bench lies in them."""
    return [str(ipaddress.IPv4Network((0x64000000 + 8 * i, 30))) for i in range(count)]


def check_cases(known: bool, calls: int) -> list[harness.Case]:
    """client_ip() and audience.counts() of a rule with no networks, then with each size; ``known``:
    the same few clients again and again, else a client never seen by any cache at each call."""
    from django.test import RequestFactory

    from django_throttle.audience import counts
    from django_throttle.engine.request_state import client_ip
    from django_throttle.networks import network_set

    factory = RequestFactory()
    cases = []
    for i, size in enumerate((0, *SIZES)):
        listed = network_set("\n".join(networks(size)), 64)
        rule = harness.make_rule(i + 1, "fixed_window", 10**9, exempt_networks=listed)
        clients = harness.addresses(8 if known else calls, PREFIXES[i])
        requests = [factory.get("/", REMOTE_ADDR=a) for a in clients]

        def op(request: Any, rule: Any = rule) -> None:
            assert counts(rule, request, client_ip(request, 0, 64))

        name = f"{size:,} networks" if size else "none"
        cases.append(harness.Case(name, op, lambda j, r=requests: r[j % len(r)]))
    return cases


def timed(cases: list[harness.Case], calls: int) -> list[harness.Case]:
    harness.interleaved(cases, rounds=4, per_round=calls // 4, warmup=200)
    return cases


def show(cases: list[harness.Case]) -> list[tuple[str, str, str]]:
    """Each case's median and, after the first, its difference to the first's."""
    base = cases[0].median_us
    return [
        (c.name, f"{c.median_us:.2f}", f"{c.median_us - base:+.2f}" if c is not cases[0] else "")
        for c in cases
    ]


def ban_cases(calls: int) -> list[harness.Case]:
    """begin() alone, then begin() and enforce_bans(), for a client not banned (anonymous, with
    an API key), 10,000 bans in force (4,000 addresses, 4,000 networks, 1,000 users, 1,000 API
    keys): a known client, then a new one at each call (disjoint addresses per case)."""
    from django.contrib.auth.models import AnonymousUser
    from django.test import RequestFactory

    from django_throttle.engine import begin, enforce_bans
    from django_throttle.models import Ban, Rule
    from django_throttle.rules import get_rules, rule_cache

    Rule.objects.create(name="keys", scope="/api/", limit=1, key_kind="header", key_arg="X-Api-Key")
    Ban.objects.bulk_create(
        [Ban(key=f"ip:{n}") for n in networks(4_000)]
        + [Ban(key=f"ip:101.{i // 256 % 256}.{i % 256}.1") for i in range(4_000)]
        + [Ban(key=f"user:{i}") for i in range(1, 1_001)]
        + [Ban(key=f"header:banned-{i}") for i in range(1_000)]
    )
    rule_cache().invalidate()
    assert len(get_rules().bans or ()) == 10_000

    def request(address: str) -> Any:
        made = RequestFactory().get("/", REMOTE_ADDR=address, HTTP_X_API_KEY=f"key-{address}")
        made.user = AnonymousUser()
        return made

    began = functools.partial(begin, in_thread=False)

    def checked(request: Any) -> None:
        began(request)
        assert enforce_bans(request) is None

    cases = []
    for n, (who, count) in enumerate((("a known client", 8), ("a client never seen", calls))):
        for m, (step, op) in enumerate((("begin()", began), ("+ enforce_bans()", checked))):
            requests = [request(a) for a in harness.addresses(count, PREFIXES[3 + 2 * n + m])]
            cases.append(harness.Case(f"{who}: {step}", op, lambda j, r=requests: r[j % len(r)]))
    return cases


def network_cases(calls: int) -> None:
    """The exempt networks' tables."""
    from django.core.handlers.wsgi import WSGIHandler

    from django_throttle.models import Rule
    from django_throttle.networks import network_set

    started = time.perf_counter()
    network_set("\n".join(networks(SIZES[-1])), 64)
    built = time.perf_counter() - started
    for size in (0, *SIZES):
        cidrs = "\n".join(networks(size))
        Rule.objects.create(name=f"n{size}", scope=f"/n{size}/", limit=10**9, exempt_networks=cidrs)
    print(f"\nBuilding the set of {SIZES[-1]:,} networks (once, as rules load): {built:.3f} s")
    columns = ("exempt networks", "µs (median)", "over none")
    for known in (True, False):
        cases = timed(check_cases(known, calls + 200), calls)
        who = "a known client" if known else "a client never seen (each call)"
        print(f"\n## audience.counts() of one rule, {who}\n")
        harness.table(columns, show(cases))
    app = WSGIHandler()  # a GET through Django and the middleware, each rule's path
    cases = [harness.request_case(f"{n:,} networks", app, f"/n{n}/", n=8) for n in (0, *SIZES)]
    timed(cases, calls)
    print("\n## A GET through Django's WSGI handler and the middleware, a known client\n")
    harness.table(columns, show(cases))
    from django.conf import settings
    from django.test import override_settings

    # Changed through override_settings (setting_changed sent): the package builds it again.
    throttle = {**settings.DJANGO_THROTTLE, "EXEMPT_NETWORKS": networks(SIZES[-1])}
    override_settings(DJANGO_THROTTLE=throttle).enable()
    cases = timed(check_cases(False, calls + 200)[-1:], calls)
    last = f"The same rule under EXEMPT_NETWORKS of {SIZES[-1]:,} too, a client never seen"
    print(f"\n## {last}: {cases[0].median_us:.2f} µs\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=8_000, help="timed calls per case")
    parser.add_argument("--bans", action="store_true", help="only what bans cost")
    options = parser.parse_args()
    with harness.RedisServer(cpu=harness.CPU) as server:
        harness.pin_client(harness.CPU)
        harness.configure_site(server.url, __name__, database=DATABASE)
        from django.conf import settings
        from django.urls import path

        plain = harness.plain_view()
        urlpatterns[:] = [path("<slug:case>/", lambda request, case: plain(request))]  # 1 resolve

        settings.MIDDLEWARE = [harness.THROTTLE]  # the middleware alone

        harness.print_machine()
        if not options.bans:
            network_cases(options.calls)
        cases = timed(ban_cases(options.calls + 200), options.calls)
        print("## A client not banned, 10,000 bans: begin() alone and with the ban check\n")
        rows = [*show(cases[:2]), *show(cases[2:])]
        harness.table(("client: step", "µs (median)", "the ban check"), rows)


if __name__ == "__main__":
    main()
