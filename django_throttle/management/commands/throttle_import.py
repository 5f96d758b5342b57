"""Create, change (and with --prune delete) rules from a YAML or JSON file."""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_throttle.management.rulefiles import (
    MAX_FILE_BYTES,
    RuleFileError,
    import_rules,
    parse,
)


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
        # A name that is not UTF-8 reaches Python with surrogates, which stderr cannot print.
        shown = file.encode("utf-8", "backslashreplace").decode("utf-8")
        try:
            with path.open("rb") as stream:
                # One byte past the cap is enough to refuse a larger file (or an endless one).
                raw = stream.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise CommandError(f"Cannot read {shown}: {exc.strerror or exc}.") from None
        fmt = "json" if path.suffix.lower() == ".json" else "yaml"
        try:
            plan = import_rules(parse(raw, fmt), prune=prune, dry_run=dry_run)
        except RuleFileError as exc:
            raise CommandError(f"{shown}: {exc}; nothing was written.") from None
        for line in plan.lines(dry_run):
            self.stdout.write(line)
