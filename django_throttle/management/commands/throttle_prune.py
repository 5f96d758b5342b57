"""Delete rejection counts older than RETENTION_DAYS (or --days), and compact the rest."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from django_throttle.conf import conf
from django_throttle.rejection_log import compact, prune


class Command(BaseCommand):
    help = (
        "Delete rejection counts older than DJANGO_THROTTLE['RETENTION_DAYS'] days, and merge "
        "those past the dashboard's hour into quarter hours and past its day into two hours."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--days", type=int, default=None, help="Keep this many days instead of RETENTION_DAYS."
        )

    def handle(self, *args: Any, days: int | None, **options: Any) -> None:
        days = conf.RETENTION_DAYS if days is None else days
        deleted = prune(days)
        self.stdout.write(f"Deleted {deleted} rejection row(s) older than {days} days.")
        merged = compact()
        self.stdout.write(f"Merged {merged} rejection row(s) into longer periods.")
