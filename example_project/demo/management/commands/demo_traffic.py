"""Fire a bounded burst of requests through the demo site, in this process, to fill the dashboard."""

import logging
from collections import Counter

from django.core.management.base import BaseCommand
from django.test import Client

from django_throttle.rejection_log import flush

# (method, path, client addresses, requests per address, extra request headers)
PLAN = [
    ("get", "/api/items/", [f"203.0.113.{n}" for n in range(7, 10)], 28, {}),
    ("get", "/items/3/", ["198.51.100.4", "198.51.100.5"], 16, {}),
    ("get", "/search/?q=item", ["192.0.2.44"], 36, {}),
    ("get", "/orders/", ["192.0.2.80"], 12, {}),
    ("post", "/login/", ["192.0.2.66"], 8, {}),
    # One API key from many addresses: within each address's limit, over the key's
    # log-only rule (api-clients), so its would-be rejections show as shadow.
    (
        "get",
        "/api/items/",
        [f"192.0.2.{n}" for n in range(100, 106)],
        19,
        {"HTTP_X_API_KEY": "k-1"},
    ),
]


class Command(BaseCommand):
    help = (
        "Send a few hundred requests through the demo's throttled views, in this process, "
        "so that rules reject some; then write the rejection counts for the dashboard."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--rounds", type=int, default=1, help="Repeat the plan this many times (default 1)."
        )

    def handle(self, *args, rounds, **options):
        client = Client(HTTP_HOST="127.0.0.1")  # a host the demo's ALLOWED_HOSTS accepts
        seen: Counter[tuple[str, int]] = Counter()
        # Django logs every 4xx as a warning: hundreds of lines that say nothing new here.
        request_log = logging.getLogger("django.request")
        level = request_log.level
        request_log.setLevel(logging.ERROR)
        try:
            self._run(client, rounds, seen)
        finally:
            request_log.setLevel(level)
        for (path, status), count in sorted(seen.items()):
            self.stdout.write(f"{path:<14} {status}: {count}")
        rows = flush()
        self.stdout.write(
            self.style.SUCCESS(
                f"Wrote {rows} rejection row(s). Open http://127.0.0.1:8000/admin/django_throttle/dashboard/"
            )
        )

    def _run(self, client, rounds, seen):
        for _ in range(max(1, rounds)):
            for method, path, addresses, times, headers in PLAN:
                data = {"username": "nobody", "password": "wrong"} if method == "post" else None
                for address in addresses:
                    for _ in range(times):
                        response = getattr(client, method)(
                            path, data, REMOTE_ADDR=address, **headers
                        )
                        seen[(path.split("?")[0], response.status_code)] += 1
