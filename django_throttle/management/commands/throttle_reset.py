"""Forget the state of one client key under every rule of a scope."""

from __future__ import annotations

from typing import Any

from django_throttle.api import reset
from django_throttle.management.scope_key import ScopeKeyCommand, no_rule


class Command(ScopeKeyCommand):
    help = "Reset a client key (ip:203.0.113.7, user:42, global) under every rule of a scope."

    def handle(self, *args: Any, scope: str, key: str, **options: Any) -> None:
        count = reset(scope, key)
        if not count:
            raise no_rule(scope)
        self.stdout.write(
            f"Reset {key} under {count} rule{'s' if count != 1 else ''} of {scope!r}."
        )
