"""The partner's API of the Celery example, for the tests: a call is recorded in the store's
Redis with the store's clock (TIME), so that the test can count calls per second."""

from __future__ import annotations

import json
import os

import redis

CALLS = "celery-example:calls"


class PartnerBusy(Exception):
    """The partner asked to come back later."""


def send_order(partner: str, order_id: int) -> None:
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    try:
        seconds, micros = client.time()
        client.rpush(CALLS, json.dumps([partner, order_id, seconds + micros / 1e6]))
    finally:
        client.close()
