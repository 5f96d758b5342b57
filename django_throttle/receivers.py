"""Signal receivers, connected by AppConfig.ready(): a rule written anywhere reloads every
process's rules; a settings change rebuilds the store and the rule cache."""

from __future__ import annotations

from typing import Any

from django.core.signals import setting_changed
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save

from .models import Override, Rule, validate_row
from .rules import reset_rule_cache, rules_changed
from .signals import rules_written
from .store import reset_store


def rule_written(**kwargs: Any) -> None:
    rules_changed()


def raw_rule_saved(instance: Rule, raw: bool, **kwargs: Any) -> None:
    """loaddata saves without save(): an enabled rule is validated as the admin would."""
    if raw and instance.enabled:
        validate_row(instance, validate_unique=False)  # the table's constraint checks that


def settings_changed(setting: str, **kwargs: Any) -> None:
    if setting in ("DJANGO_THROTTLE", "CACHES"):
        reset_rule_cache()
        reset_store()


def connect() -> None:
    pre_save.connect(raw_rule_saved, sender=Rule, dispatch_uid="django_throttle.rule_loaded")
    post_save.connect(rule_written, sender=Rule, dispatch_uid="django_throttle.rule_saved")
    post_delete.connect(rule_written, sender=Rule, dispatch_uid="django_throttle.rule_deleted")
    post_save.connect(rule_written, sender=Override, dispatch_uid="django_throttle.override_saved")
    for through in (Rule.groups.through, Rule.exempt_groups.through):
        m2m_changed.connect(rule_written, sender=through, dispatch_uid=f"django_throttle.{through}")
    post_delete.connect(
        rule_written, sender=Override, dispatch_uid="django_throttle.override_deleted"
    )
    rules_written.connect(rule_written, dispatch_uid="django_throttle.rules_written")
    setting_changed.connect(settings_changed, dispatch_uid="django_throttle.setting_changed")
