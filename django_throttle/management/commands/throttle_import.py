"""Create, change (and with --prune delete) rules from a YAML or JSON file."""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_throttle.management.rulefiles import RuleFileError, import_rules, load


class Command(BaseCommand):
    help = (
        "Import rules from a file written by throttle_export (YAML or JSON). Every rule is "
        "validated as the admin does; if one is invalid, nothing is written."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("file", help="A .yaml/.yml or .json file.")
        parser.add_argument(
            "--dry-run", action="store_true", help="Print what would change; write nothing."
        )
        parser.add_argument(
            "--prune", action="store_true", help="Delete the rules that the file does not name."
        )

    def handle(self, *args: Any, file: str, dry_run: bool, prune: bool, **options: Any) -> None:
        path = Path(file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"Cannot read {file}: {exc.strerror}.") from None
        fmt = "json" if path.suffix.lower() == ".json" else "yaml"
        try:
            plan = import_rules(load(text, fmt), prune=prune, dry_run=dry_run)
        except RuleFileError as exc:
            raise CommandError(f"{file}: {exc}; nothing was written.") from None
        for line in plan.lines():
            self.stdout.write(("would " if dry_run else "") + line)
