"""Write every process's rejection counts to the database now, and prune and compact if due."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from django_throttle.rejection_log import flush


class Command(BaseCommand):
    help = (
        "Write the rejection counts of every process to the database now: those each process "
        "hands to Redis every second, and this process's own (each process also writes them "
        "every FLUSH_INTERVAL seconds and at exit). With the memory backend, only this "
        "process's: useful from scripts that ran requests in-process, through call_command."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        written = flush()
        self.stdout.write(f"Flushed {written} rejection row(s).")
