"""``request_throttled``; and receivers: rule writes refresh every process's rules, settings
changes reset state."""

from __future__ import annotations

from typing import Any

from django.core.signals import setting_changed
from django.db.models.signals import post_delete, post_save
from django.dispatch import Signal, receiver

from .models import Rule
from .rules import reset_rule_cache, rules_changed
from .store import reset_store

# Sent for every rejected request (shadow=False) and every would-be rejection of a
# log-only rule (shadow=True), with the request, the rule's name and the Decision.
request_throttled = Signal()

# Sent when this process finds the store unavailable (available=False, error=...) and
# when it reaches it again (available=True); once per change, not per request.
store_state_changed = Signal()


@receiver(post_save, sender=Rule, dispatch_uid="django_throttle.rule_saved")
@receiver(post_delete, sender=Rule, dispatch_uid="django_throttle.rule_deleted")
def _rule_written(**kwargs: Any) -> None:
    rules_changed()


@receiver(setting_changed, dispatch_uid="django_throttle.setting_changed")
def _setting_changed(setting: str, **kwargs: Any) -> None:
    if setting in ("DJANGO_THROTTLE", "CACHES"):
        reset_rule_cache()
        reset_store()
