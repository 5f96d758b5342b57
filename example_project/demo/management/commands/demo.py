"""Set up and run the demo: migrate, seed rules, create a superuser if none, run the server."""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from django_throttle.conf import conf
from django_throttle.models import Rule
from example_project.demo.rules import DEMO_RULES, RETIRED_RULES

DEMO_USERNAME = "admin"
DEMO_PASSWORD = "admin"


class Command(BaseCommand):
    help = "Migrate, seed the demo rules, create a demo superuser if none exists, run the server."

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")
        parser.add_argument(
            "--no-server", action="store_true", help="Set up only; do not run the server."
        )

    def handle(self, *args, addrport, no_server, **options):
        call_command("migrate", interactive=False, verbosity=0)
        for fields in RETIRED_RULES:
            Rule.objects.filter(**fields).delete()
        created = 0
        for fields in DEMO_RULES:
            _, was_created = Rule.objects.get_or_create(name=fields["name"], defaults=fields)
            created += was_created
        self.stdout.write(f"Demo rules: {created} created, {Rule.objects.count()} in total.")

        User = get_user_model()
        if not User.objects.filter(is_superuser=True).exists():
            User.objects.create_superuser(DEMO_USERNAME, "admin@example.com", DEMO_PASSWORD)
            self.stdout.write(
                self.style.SUCCESS(
                    f"Created the superuser {DEMO_USERNAME!r} with password {DEMO_PASSWORD!r}."
                )
            )
        else:
            self.stdout.write("A superuser exists already; log in with it.")

        if conf.uses_redis:
            location = settings.CACHES[conf.CACHE]["LOCATION"]
            self.stdout.write(f"Store: Redis at {location}.")
        else:
            self.stdout.write(
                self.style.WARNING(
                    "Store: the embedded in-memory backend (one process, counters lost on "
                    "restart). Set REDIS_URL=redis://127.0.0.1:6379/0 to use Redis."
                )
            )
        host = addrport.rsplit(":", 1)[0] if ":" in addrport else "127.0.0.1"
        port = addrport.rsplit(":", 1)[-1]
        self.stdout.write(f"Admin: http://{host}:{port}/admin/django_throttle/rule/")
        self.stdout.write(
            f"Dashboard: http://{host}:{port}/admin/django_throttle/dashboard/ "
            "(fill it with: .venv/bin/python manage.py demo_traffic)"
        )
        if not no_server:
            call_command("runserver", addrport, use_reloader=False)  # set up once, serve once
