from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DjangoThrottleConfig(AppConfig):
    name = "django_throttle"
    verbose_name = _("Rate limiting")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, receivers  # noqa: F401  (checks register themselves on import)

        receivers.connect()
