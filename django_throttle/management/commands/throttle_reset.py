"""Forget the state of one client key under every rule of a scope."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_throttle.api import reset


class Command(BaseCommand):
    help = "Reset a client key (ip:203.0.113.7, user:42, global) under every rule of a scope."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("scope", help="The rules' scope, e.g. login or /api/.")
        parser.add_argument("key", help="The client key, as the dashboard shows it.")

    def handle(self, *args: Any, scope: str, key: str, **options: Any) -> None:
        count = reset(scope, key)
        if not count:
            raise CommandError(f"No rule of scope {scope!r} is enabled (nor a code default).")
        self.stdout.write(
            f"Reset {key} under {count} rule{'s' if count != 1 else ''} of {scope!r}."
        )
