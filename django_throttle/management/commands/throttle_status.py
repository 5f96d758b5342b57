"""Show the state of one client key under every rule of a scope, without consuming."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from django_throttle.engine import inspect, rule_for
from django_throttle.management.scope_key import ScopeKeyCommand, no_rule
from django_throttle.rules import get_rules, scope_rules


class Command(ScopeKeyCommand):
    help = "Show the state of a client key (ip:203.0.113.7, user:42, global) under a scope's rules."

    def handle(self, *args: Any, scope: str, key: str, **options: Any) -> None:
        rules = scope_rules(get_rules(), scope)
        if not rules:
            raise no_rule(scope)
        applied = []
        for rule in rules:
            own = rule_for(rule, key)  # as the engine applies it to this client
            if own is None:
                self.stdout.write(f"{rule.name}: this client is exempt (an override)")
                continue
            applied.append(own)
        results = inspect(applied, key)
        for result in results:
            reset = datetime.fromtimestamp(result.reset_at, tz=timezone.utc)
            line = (
                f"{result.rule.name}: {result.remaining} of {result.limit} remaining, "
                f"resets {reset:%Y-%m-%d %H:%M:%S} UTC"
            )
            if not result.allowed:
                line += f", next request rejected (retry in {result.retry_after:.0f} s)"
            self.stdout.write(line)
