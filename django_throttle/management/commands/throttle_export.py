"""Write every rule, with its groups and overrides, as YAML or JSON."""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_throttle.management.rulefiles import RuleFileError, dump, export_rules


class Command(BaseCommand):
    help = "Export the rules (YAML by default, or JSON) to standard output or a file."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--format", choices=("yaml", "json"), default="yaml")
        parser.add_argument("-o", "--output", help="A file to write instead of standard output.")

    def handle(self, *args: Any, format: str, output: str | None, **options: Any) -> None:
        try:
            text = dump(export_rules(), format)
        except RuleFileError as exc:
            raise CommandError(str(exc)) from None
        if output:
            Path(output).write_text(text, encoding="utf-8")
        else:
            self.stdout.write(text, ending="")
