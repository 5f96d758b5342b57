"""What throttle_reset and throttle_status share: a scope and a client key."""

from __future__ import annotations

from argparse import ArgumentParser

from django.core.management.base import BaseCommand, CommandError


class ScopeKeyCommand(BaseCommand):
    """A command about one client key under every rule of a scope."""

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("scope", help="The rules' scope, e.g. login or /api/.")
        parser.add_argument("key", help="The client key, as the dashboard shows it.")


def no_rule(scope: str) -> CommandError:
    """The error of a scope that no rule covers."""
    return CommandError(f"No rule of scope {scope!r} is enabled (nor a code default).")
