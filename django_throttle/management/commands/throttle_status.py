"""Show the state of one client key under every rule of a scope, without consuming."""

from __future__ import annotations

from argparse import ArgumentParser
from datetime import datetime, timezone
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_throttle.rules import get_rules, scope_rules
from django_throttle.store import Check, get_store


class Command(BaseCommand):
    help = "Show the state of a client key (ip:203.0.113.7, user:42, global) under a scope's rules."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("scope", help="The rules' scope, e.g. login or /api/.")
        parser.add_argument("key", help="The client key, as the dashboard shows it.")

    def handle(self, *args: Any, scope: str, key: str, **options: Any) -> None:
        rules = scope_rules(get_rules(), scope)
        if not rules:
            raise CommandError(f"No rule of scope {scope!r} is enabled (nor a code default).")
        checks = []
        for rule in rules:
            # As the engine applies it to this client: its override, if it has one.
            if rule.overrides is not None and key in rule.overrides:
                own = rule.overrides[key]
                if own is None:
                    self.stdout.write(f"{rule.name}: this client is exempt (an override)")
                    continue
                rule = own
            checks.append(Check(rule, key))
        results = get_store().inspect(checks)
        for result in results:
            reset = datetime.fromtimestamp(result.reset_at, tz=timezone.utc)
            line = (
                f"{result.rule.name}: {result.remaining} of {result.limit} remaining, "
                f"resets {reset:%Y-%m-%d %H:%M:%S} UTC"
            )
            if not result.allowed:
                line += f", next request rejected (retry in {result.retry_after:.0f} s)"
            self.stdout.write(line)
