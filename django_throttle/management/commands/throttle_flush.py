"""Persist the rejection counts buffered in this process now, and prune if due."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from django_throttle.recording import flush


class Command(BaseCommand):
    help = (
        "Persist the rejection counts buffered in this process now (each process also does it "
        "every FLUSH_INTERVAL seconds and at exit); useful from scripts that ran requests "
        "in-process, through call_command."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        written = flush()
        self.stdout.write(f"Flushed {written} rejection row(s).")
