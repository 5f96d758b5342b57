"""The clock-shifting harness itself: a real redis-server whose TIME runs ahead or behind."""

from __future__ import annotations

import time

import pytest

from tests.clock_shift import shifted
from tests.redis_server import RedisServer

DAY = 86400


@pytest.mark.parametrize("shift", [40 * DAY, -3 * 3600, 0.5])
def test_a_shifted_server_tells_the_shifted_time(shift: float) -> None:
    server = RedisServer(env=shifted(shift))
    server.start()
    try:
        client = server.client()
        seconds, micros = client.time()
        client.close()
        told = seconds + micros / 1e6
        assert abs(told - (time.time() + shift)) < 0.2
    finally:
        server.close()
