"""MAX_DELAYED "auto" counts the threads seen serving at once, also where a sync view is
throttled by @throttle alone (no ThrottleMiddleware)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from django_throttle.engine import serving

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_decorated_sync_view_counts_the_threads_serving(monkeypatch: Any) -> None:
    monkeypatch.setattr(serving(), "most", 0)
    barrier = threading.Barrier(3)
    statuses: list[int] = []

    def one() -> None:
        barrier.wait()
        try:
            statuses.append(Client().get("/slow/decorated/").status_code)  # 2 s each
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200, 200, 200]
    assert serving().most == 3  # three views ran at once: the server has at least 3 threads
