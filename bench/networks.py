"""What exempt networks cost a request, with 10,000 and 100,000 CIDRs listed (docs/bounds.md,
"Exempt networks"; docs/benchmarks.md); and what 10,000 bans cost a client not banned."""

from __future__ import annotations

import argparse
import ipaddress
import time
from typing import Any

import harness

urlpatterns: list[Any] = []  # this module is the ROOT_URLCONF
SIZES = (10_000, 100_000)
# Disjoint client ranges, one per case: a "new" client is never one the caches saw.
PREFIXES = ("198.18", "198.19", "198.20", "198.21", "198.22", "198.23")


def urls() -> None:
    from django.urls import path

    plain = harness.plain_view()
    urlpatterns[:] = [path("<slug:case>/", lambda request, case: plain(request))]  # one resolve


def networks(count: int) -> list[str]:
    """``count`` /30s spread over 100.0.0.0/8: no client of the bench lies in them."""
    return [str(ipaddress.IPv4Network((0x64000000 + 8 * i, 30))) for i in range(count)]


def check_cases(known: bool, calls: int) -> list[harness.Case]:
    """client_ip() and audience.counts() of a rule with no networks, then with each size; ``known``:
    the same few clients again and again, else a client never seen by any cache at each call."""
    from django.test import RequestFactory

    from django_throttle.audience import counts
    from django_throttle.compiled import build_rule
    from django_throttle.engine.request_state import client_ip
    from django_throttle.networks import network_set

    factory = RequestFactory()
    cases = []
    for i, size in enumerate((0, *SIZES)):
        rule = build_rule(
            id=i + 1,
            name=f"n{size}",
            algorithm="fixed_window",
            limit=10**9,
            period=3600,
            exempt_networks=network_set("\n".join(networks(size)), 64),
        )
        clients = harness.addresses(8 if known else calls, PREFIXES[i])
        requests = [factory.get("/", REMOTE_ADDR=a) for a in clients]

        def op(request: Any, rule: Any = rule) -> None:
            assert counts(rule, request, client_ip(request, 0, 64))

        cases.append(
            harness.Case(
                f"{size:,} networks" if size else "none",
                op,
                lambda j, requests=requests: requests[j % len(requests)],
            )
        )
    return cases


def request_cases(app: Any) -> list[harness.Case]:
    """A GET through Django and the middleware from a known client, on a rule without networks
    and on rules with each size."""
    return [
        harness.request_case(f"{size:,} networks" if size else "none", app, path, n=8)
        for size, path in ((0, "/none/"), *((n, f"/n{n}/") for n in SIZES))
    ]


def show(cases: list[harness.Case]) -> list[tuple[str, str, str]]:
    base = cases[0].median_us
    return [
        (c.name, f"{c.median_us:.2f}", f"{c.median_us - base:+.2f}" if c is not cases[0] else "")
        for c in cases
    ]


def change_throttle(**values: Any) -> None:
    """DJANGO_THROTTLE changed through override_settings (setting_changed sent), so the package
    builds again what it made from the settings."""
    from django.conf import settings
    from django.test import override_settings

    override_settings(DJANGO_THROTTLE={**settings.DJANGO_THROTTLE, **values}).enable()


def ban_cases(calls: int) -> list[harness.Case]:
    """ThrottleMiddleware's begin() alone, and begin() then the ban check, for a client not
    banned, 10,000 bans in force (4,000 addresses, 4,000 networks, 1,000 users and 1,000 API
    keys): the same few clients, and a new one at each call, each anonymous with an API key.
    The difference is what the bans cost such a client."""
    from django.contrib.auth.models import AnonymousUser
    from django.test import RequestFactory

    from django_throttle.engine import begin, enforce_bans
    from django_throttle.models import Ban, Rule
    from django_throttle.rules import get_rules, rule_cache

    Rule.objects.create(
        name="keys", scope="/api/", limit=10**9, unit="hour", key_kind="header", key_arg="X-Api-Key"
    )
    Ban.objects.bulk_create(
        [Ban(key=f"ip:{n}") for n in networks(4_000)]
        + [Ban(key=f"ip:101.{i // 256 % 256}.{i % 256}.1") for i in range(4_000)]
        + [Ban(key=f"user:{i}") for i in range(1, 1_001)]
        + [Ban(key=f"header:banned-{i}") for i in range(1_000)]
    )
    rule_cache().invalidate()
    bans = get_rules().bans
    assert bans is not None and len(bans) == 10_000
    assert bans.current(time.time()).header_keys == ("HTTP_X_API_KEY",)

    def request(address: str) -> Any:
        made = RequestFactory().get("/", REMOTE_ADDR=address, HTTP_X_API_KEY=f"key-{address}")
        made.user = AnonymousUser()
        return made

    def began(request: Any) -> None:
        begin(request, in_thread=False)

    def checked(request: Any) -> None:
        begin(request, in_thread=False)
        assert enforce_bans(request) is None

    cases = []
    # The two cases of a kind of client take disjoint addresses: neither finds one the other
    # left in a cache.
    kinds = (("a known client", 8, PREFIXES[:2]), ("a client never seen", calls, PREFIXES[2:4]))
    for name, count, prefixes in kinds:
        for (step, op), prefix in zip(
            (("begin()", began), ("begin() + enforce_bans()", checked)), prefixes, strict=True
        ):
            requests = [request(a) for a in harness.addresses(count, prefix)]
            cases.append(harness.Case(f"{name}: {step}", op, lambda j, r=requests: r[j % len(r)]))
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
        Rule.objects.create(
            name=f"n{size}",
            scope=f"/n{size}/" if size else "/none/",
            limit=10**9,
            unit="hour",
            exempt_networks="\n".join(networks(size)),
        )
    print(
        f"\nBuilding the set of {SIZES[-1]:,} networks (once, when the rules load): "
        f"{built * 1000:.0f} ms"
    )
    columns = ("exempt networks", "µs (median)", "over none")
    for known in (True, False):
        cases = check_cases(known, calls + 200)
        harness.interleaved(cases, rounds=4, per_round=calls // 4, warmup=200)
        who = "a known client" if known else "a client never seen (each call)"
        print(f"\n## audience.counts() of one rule, {who}\n")
        harness.table(columns, show(cases))
    cases = request_cases(WSGIHandler())
    harness.interleaved(cases, rounds=4, per_round=calls // 4, warmup=200)
    print("\n## A GET through Django's WSGI handler and the middleware, a known client\n")
    harness.table(columns, show(cases))
    change_throttle(EXEMPT_NETWORKS=networks(SIZES[-1]))
    cases = check_cases(False, calls + 200)[-1:]
    harness.interleaved(cases, rounds=4, per_round=calls // 4, warmup=200)
    print(
        f"\n## The same rule under EXEMPT_NETWORKS of {SIZES[-1]:,} too, a client never "
        f"seen: {cases[0].median_us:.2f} µs\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=8_000, help="timed calls per case")
    parser.add_argument("--bans", action="store_true", help="only what bans cost")
    options = parser.parse_args()
    with harness.RedisServer(cpu=harness.CPU) as server:
        harness.pin_client(harness.CPU)
        harness.configure_site(
            server.url, __name__, database="file:networks?mode=memory&cache=shared"
        )
        urls()
        from django.conf import settings

        settings.MIDDLEWARE = [harness.THROTTLE]  # the middleware alone

        harness.print_machine()
        if not options.bans:
            network_cases(options.calls)
        cases = ban_cases(options.calls + 200)
        harness.interleaved(cases, rounds=4, per_round=options.calls // 4, warmup=200)
        print("## A client not banned, 10,000 bans: begin() alone and with the ban check\n")
        rows = []
        for alone, checked in zip(cases[::2], cases[1::2], strict=True):
            rows.append((alone.name, f"{alone.median_us:.2f}", ""))
            rows.append(
                (
                    checked.name,
                    f"{checked.median_us:.2f}",
                    f"{checked.median_us - alone.median_us:+.2f}",
                )
            )
        harness.table(("client: step", "µs (median)", "the ban check"), rows)


if __name__ == "__main__":
    main()
