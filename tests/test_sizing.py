"""Sizing a limit from real traffic: the dashboard's peaks per client window and what a limit
typed in would have rejected, against the exact figures and what a log rule records."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.utils import timezone

from django_throttle import check_key
from django_throttle.models import Rejection, SizingCount
from django_throttle.rejection_log import flush, prune
from django_throttle.rejection_log.sizing import BOUNDS, bounds_up_to, sizing
from tests.helpers import away_from_midnight, rule

pytestmark = [pytest.mark.db_matters, pytest.mark.django_db]

DASHBOARD = "/admin/django_throttle/dashboard/"
DATA = DASHBOARD + "data/"
CLIENTS = 50
LIMIT = 60  # the limit typed in, and the limit of the log rule that records what it rejects
# Requests of client i in the window: spread from 1 to 249, some of them past LIMIT.
TRAFFIC = [1 + (i * 37) % 249 for i in range(CLIENTS)]


def exact(peaks: list[int], p: float) -> int:
    """The nearest-rank percentile."""
    return sorted(peaks)[math.ceil(p * len(peaks)) - 1]


def near(measured: float, wanted: float) -> bool:
    return abs(measured - wanted) <= 0.05 * wanted


@pytest.fixture
def traffic() -> None:
    """The pattern under a wide log rule (sized) and a log rule of LIMIT (the reference)."""
    rule("sized", "api", 100_000, algorithm="fixed_window", unit="day", action="log")
    rule("at-limit", "api", LIMIT, algorithm="fixed_window", unit="day", action="log")
    away_from_midnight()
    for i, n in enumerate(TRAFFIC):
        for _ in range(n):
            assert check_key("api", f"client-{i}").allowed
    flush()


def test_the_boundaries_are_within_five_percent_and_exact_up_to_twenty():
    assert BOUNDS[:20] == tuple(range(1, 21))
    for low, high in zip(BOUNDS, BOUNDS[1:], strict=False):
        assert high - low == 1 or high <= math.ceil(low * 1.05)
    assert bounds_up_to(100)[-1] == 100 and len(bounds_up_to(1_000_000_000)) < 400


def test_peaks_and_a_typed_limit_match_the_exact_figures_and_a_log_rule(admin_client, traffic):
    data = admin_client.get(DATA, {"rule": "sized", "period": "day", "limit": LIMIT}).json()
    sized = data["sizing"]
    assert sized["rule"] == "sized" and sized["limit"] == LIMIT
    for p, name in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (1.0, "max")):
        assert near(sized[name], exact(TRAFFIC, p)), (name, sized[name], exact(TRAFFIC, p))
    wanted_clients = sum(1 for n in TRAFFIC if n > LIMIT)
    wanted_requests = sum(n - LIMIT for n in TRAFFIC if n > LIMIT)
    assert near(sized["clients_rejected"], wanted_clients)
    assert near(sized["requests_rejected"], wanted_requests)
    # What the log rule of that limit recorded on the same traffic.
    rows = Rejection.objects.filter(rule="at-limit", action="shadow")
    assert near(sized["clients_rejected"], rows.values("key").distinct().count())
    assert near(sized["requests_rejected"], sum(rows.values_list("count", flat=True)))


def test_the_dashboard_page_shows_the_sizing(admin_client, traffic):
    page = admin_client.get(DASHBOARD, {"rule": "sized", "period": "day", "limit": LIMIT})
    html = page.content.decode()
    assert 'id="throttle-sizing"' in html
    figures = sizing(_sums("sized"), 100_000, LIMIT)
    assert f'<td class="num">{figures.p90}</td>' in html
    assert (
        f"A limit of {LIMIT} would have rejected {figures.clients_rejected} client windows" in html
    )


def test_a_log_rule_is_sized_past_its_own_limit(admin_client, traffic):
    # "at-limit" only logs: its windows go on counting past LIMIT, so a limit above its own is
    # sized as one below it is, against the exact figures.
    for typed in (40, 150):
        data = admin_client.get(DATA, {"rule": "at-limit", "period": "day", "limit": typed})
        sized = data.json()["sizing"]
        assert sized["rule_limit"] == LIMIT and sized["limit"] == typed
        for p, name in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (1.0, "max")):
            assert near(sized[name], exact(TRAFFIC, p)), (name, sized[name], exact(TRAFFIC, p))
        assert near(sized["clients_rejected"], sum(1 for n in TRAFFIC if n > typed))
        assert near(sized["requests_rejected"], sum(max(0, n - typed) for n in TRAFFIC))
    html = admin_client.get(DASHBOARD, {"rule": "at-limit", "period": "day"}).content.decode()
    assert "&ge;" not in html and "Past the rule" not in html


def test_past_an_enforcing_rules_own_limit_requests_are_counted_and_marked(admin_client):
    rule("enforced", "api", LIMIT, algorithm="fixed_window", unit="day")
    away_from_midnight()
    for i, n in enumerate(TRAFFIC):
        for _ in range(n):
            check_key("api", f"client-{i}")
    flush()
    # Every client past LIMIT stopped at it: the excess is known in total only.
    data = admin_client.get(DATA, {"rule": "enforced", "period": "day", "limit": 40}).json()
    sized = data["sizing"]
    assert sized["max"] == LIMIT and sized["rule_limit"] == LIMIT
    assert near(sized["requests_rejected"], sum(max(0, n - 40) for n in TRAFFIC))
    assert near(sized["clients_rejected"], sum(1 for n in TRAFFIC if n > 40))
    html = admin_client.get(DASHBOARD, {"rule": "enforced", "period": "day"}).content.decode()
    assert f"&ge; {LIMIT}</td>" in html


@pytest.mark.parametrize("limit", ["abc", "0", "-3", "1e9", "99999999999999999999"])
def test_a_bad_limit_is_a_form_error(admin_client, limit):
    rule("sized", "api", 1000, algorithm="fixed_window", unit="day", action="log")
    page = admin_client.get(DASHBOARD, {"rule": "sized", "limit": limit})
    assert page.status_code == 200
    assert 'class="errorlist' in page.content.decode()
    data = admin_client.get(DATA, {"rule": "sized", "limit": limit})
    assert data.status_code == 400 and "limit" in data.json()["errors"]


def test_a_limit_past_an_enforcing_rules_own_is_a_form_error(admin_client):
    rule("sized", "api", 1000, algorithm="fixed_window", unit="day")
    page = admin_client.get(DASHBOARD, {"rule": "sized", "limit": 1000}).content.decode()
    assert "Past the rule&#x27;s own limit (1000)" in page
    assert admin_client.get(DATA, {"rule": "sized", "limit": 1000}).status_code == 400


def test_other_algorithms_say_sizing_is_not_available(admin_client):
    rule("smooth", "api", 10, algorithm="sliding_window_counter")
    for _ in range(3):
        check_key("api", "client")
    flush()
    assert not SizingCount.objects.exists()
    page = admin_client.get(DASHBOARD, {"rule": "smooth"}).content.decode()
    assert "Sizing is not available for this rule" in page
    assert admin_client.get(DATA, {"rule": "smooth"}).json()["sizing"] is None


def test_a_costly_request_counts_every_boundary_it_crosses():
    rule("sized", "api", 1000, algorithm="fixed_window", unit="day", action="log")
    away_from_midnight()
    for _ in range(4):
        check_key("api", "client", cost=10)  # 10, 20, 30, 40
    flush()
    sums = _sums("sized")
    assert {b for b, n in sums.items() if n == 1} == {b for b in BOUNDS if b <= 40}
    assert near(sizing(sums, 1000).max, 40)


def test_no_rule_chosen_no_sizing(admin_client):
    assert admin_client.get(DATA).json()["sizing"] is None


def _sums(name: str) -> dict[int, int]:
    sums: dict[int, int] = {}
    for reached, count in SizingCount.objects.filter(rule=name).values_list("reached", "count"):
        sums[reached] = sums.get(reached, 0) + count
    return sums


def test_each_boundary_is_counted_once_by_racing_threads():
    rule("sized", "api", 100_000, algorithm="fixed_window", unit="day", action="log")
    away_from_midnight()
    threads, each = 8, 40
    check_key("api", "warm-up")  # the rules loaded here: the threads' connections see none

    def burst() -> None:
        for _ in range(each):
            check_key("api", "one-client")

    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(burst) for _ in range(threads)]:
            future.result()
    flush()
    total = threads * each
    wanted = dict.fromkeys((b for b in BOUNDS if b <= total), 1)
    assert _sums("sized") == {**wanted, 1: 2}  # and the warm-up's first request


def test_with_the_memory_backend_the_counts_go_straight_to_the_database(settings):
    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "BACKEND": "memory"}
    rule("sized", "api", 1000, algorithm="fixed_window", unit="day", action="log")
    away_from_midnight()
    for _ in range(5):
        check_key("api", "client")
    flush()
    assert _sums("sized") == dict.fromkeys(range(1, 6), 1)


@pytest.mark.topology
def test_on_a_cluster_the_counts_of_every_slot_meet_in_one(settings):
    from django_throttle.runtime import replace_runtime
    from tests.redis_topology import ClusterHarness

    with ClusterHarness() as cluster:
        settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "CLUSTER_URL": cluster.url}
        replace_runtime(handover=False)
        try:
            rule("sized", "api", 1000, algorithm="fixed_window", unit="day", action="log")
            away_from_midnight()
            peaks = [1 + i % 20 for i in range(30)]  # up to 20: every count is a boundary
            for i, n in enumerate(peaks):
                for _ in range(n):
                    check_key("api", f"client-{i}")
            flush()
        finally:
            replace_runtime(handover=False)
    wanted = {b: sum(1 for n in peaks if n >= b) for b in range(1, 21)}
    assert _sums("sized") == wanted
    figures = sizing(wanted, 1000, 10)
    assert (figures.p50, figures.max) == (exact(peaks, 0.5), 20)
    assert figures.clients_rejected == sum(1 for n in peaks if n > 10)
    assert figures.requests_rejected == sum(n - 10 for n in peaks if n > 10)


def test_the_counts_are_kept_retention_days(settings):
    now = timezone.now()
    for days in (31, 29):
        SizingCount.objects.create(rule="sized", hour=now - timedelta(days=days), reached=1)
    prune()
    assert list(SizingCount.objects.values_list("hour", flat=True)) == [now - timedelta(days=29)]
