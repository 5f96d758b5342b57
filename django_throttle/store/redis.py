"""The Redis backend: every check of a request in one EVALSHA of decide.lua."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

from ..rules import ALGORITHM_CODES, CompiledRule
from .base import Check, Result, state_key

US = 1_000_000


def load_lua(name: str) -> str:
    return resources.files("django_throttle.store").joinpath("lua", name).read_text("utf-8")


class RedisStore:
    """Decisions in Redis. The client comes from django-redis, so Redis is configured in CACHES."""

    def __init__(self, client: Any) -> None:
        self.client = client
        # register_script runs EVALSHA and reloads the script by itself on NOSCRIPT
        # (after SCRIPT FLUSH or a restart of the server).
        self._decide = client.register_script(_DECIDE_SOURCE)

    @classmethod
    def from_cache(cls, alias: str) -> RedisStore:
        from django_redis import get_redis_connection

        return cls(get_redis_connection(alias))

    def decide(self, checks: Sequence[Check], dry_run: bool = False) -> list[Result]:
        if not checks:
            return []
        # Redis Cluster: every key carries the same hash tag (state_prefix), so one call
        # is valid. To spread rules over slots, group the checks by slot here and make
        # one call per group, giving up all-or-nothing across groups.
        keys = []
        args: list[Any] = ["1" if dry_run else "0"]
        for check in checks:
            rule = check.rule
            keys.append(state_key(rule, check.identity))
            args += (
                ALGORITHM_CODES[rule.algorithm],
                rule.limit,
                rule.period,
                rule.burst,
                check.cost,
                "0" if rule.action == "log" else "1",
            )
        reply = self._decide(keys=keys, args=args)
        return parse_reply(checks, reply)

    def reset(self, rule: CompiledRule, identity: str) -> None:
        self.client.delete(state_key(rule, identity))


def parse_reply(checks: Sequence[Check], reply: Sequence[int]) -> list[Result]:
    now = reply[0] / US
    results = []
    i = 2
    for check in checks:
        allowed, remaining, reset_after, retry_after, delay = reply[i : i + 5]
        i += 5
        results.append(
            Result(
                rule=check.rule,
                allowed=allowed == 1,
                limit=check.rule.limit,
                remaining=remaining,
                reset_at=now + reset_after / US,
                retry_after=retry_after / US,
                delay=delay / US,
            )
        )
    return results


_DECIDE_SOURCE = load_lua("decide.lua")
