"""`delay` cannot starve a server: with the default settings, a flood on a delay rule through a
real threaded WSGI server (gunicorn, 4 threads) holds at most one of its threads per client
(MAX_DELAYED_PER_CLIENT) and at most half of them in all (MAX_DELAYED "auto"), so an
unthrottled request of the same worker is served while the flood's held requests sleep."""

from __future__ import annotations

import json
import threading
import time
from http.client import HTTPConnection
from typing import Any

import pytest
from django.db import connection

from tests.helpers import rule
from tests.served import serving

pytest.importorskip("gunicorn")

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

GUNICORN = [
    "gunicorn",
    "tests.served:wsgi",
    "--bind",
    "127.0.0.1:{port}",
    "--worker-class",
    "gthread",
    "--workers",
    "1",
    "--threads",
    "4",
    "--graceful-timeout",
    "1",
    "--log-level",
    "warning",
]
FLOOD = 6  # connections of the one client, each sending its next request as soon as answered


def get(
    port: int, path: str, timeout: float = 30.0, client_ip: str | None = None
) -> tuple[int, dict[str, Any]]:
    client = HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        client.request("GET", path, headers={"X-Forwarded-For": client_ip} if client_ip else {})
        response = client.getresponse()
        body = response.read()
        return response.status, json.loads(body) if response.status == 200 else {}
    finally:
        client.close()


# The spans are the store's times of each decision and of its computed wake-up; a held request
# takes its slot when its reply reaches the server's thread and frees it when it wakes, each a
# few milliseconds later (tens under load). A request decided that close before another wakes
# may take the slot the other frees: not two held at once. Holds here last up to 2 s.
SLOT_HANDOFF = 0.05


def overlapping(spans: list[tuple[float, float]]) -> int:
    """The most spans in progress at once, looked at in the middle of each span (the next
    held request is decided a moment before the one it waits behind wakes up)."""
    return max(
        sum(a <= (start + end) / 2 <= b - SLOT_HANDOFF or (a, b) == (start, end) for a, b in spans)
        for start, end in spans
    )


@pytest.mark.parametrize(
    ("clients", "cap"),
    [
        (1, 1),  # one client: one request held at a time (MAX_DELAYED_PER_CLIENT)
        (FLOOD, 2),  # a client per connection: half the 4 threads seen (MAX_DELAYED "auto")
    ],
    ids=["one-client", "many-clients"],
)
def test_a_flood_on_a_delay_rule_leaves_threads_to_serve_others(
    redis_client: Any, clients: int, cap: int
) -> None:
    rule(
        "smooth",
        "/delayed/",
        1,
        per=2,
        unit="second",
        algorithm="leaky_bucket",
        burst=50,
        action="delay",
    )
    held: list[tuple[float, float]] = []  # the store's time: when each held request slept
    statuses: list[int] = []
    probes: list[tuple[float, float]] = []  # the store's time: sent, served
    stop = threading.Event()
    lock = threading.Lock()

    # One proxy in front: X-Forwarded-For names the client.
    with serving(GUNICORN, dict(connection.settings_dict), {"TRUSTED_PROXIES": 1}) as port:

        def flood(n: int) -> None:
            ip = f"198.51.100.{n % clients + 1}"
            while not stop.is_set():
                try:
                    status, body = get(port, "/delayed/", timeout=10, client_ip=ip)
                except OSError:  # still held when the server stops
                    return
                with lock:
                    statuses.append(status)
                    if status == 200 and body["delay"] > 0:
                        held.append((body["decided_at"], body["decided_at"] + body["delay"]))

        def store_time() -> float:
            seconds, micros = redis_client.time()
            return float(seconds + micros / 1_000_000)

        redis_client.config_resetstat()  # from here, count the scripts run (store calls)
        threads = [threading.Thread(target=flood, args=(n,)) for n in range(FLOOD)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(0.5)  # the flood is on: some of it sleeps, waiting its turn
            for _ in range(4):
                sent = store_time()
                status, body = get(port, "/store-now/")
                assert status == 200
                probes.append((sent, body["now"]))
                time.sleep(0.4)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        scripts = redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)

    assert held, "the flood had a request held"
    # At most the cap sleep at once; the flood's other requests get 429 at once.
    assert overlapping(held) <= cap
    assert 429 in statuses
    # Each probe sent while flood requests slept was served before the first of them woke
    # up: the flood left it a thread.
    during = 0
    for sent, served in probes:
        sleeping = [end for start, end in held if start <= sent <= end]
        if sleeping:
            during += 1
            assert served < min(sleeping)
    assert during >= 2  # the probes ran while the flood was going on
    if clients == 1:
        # While its request is held, the client's next ones are turned away by the process
        # itself: no store call for them (else two each: the decision, and the give-back).
        assert scripts * 4 < len(statuses), (scripts, len(statuses))
