"""Receivers of Django's signals: rule and ban writes, a request's start and end."""

from __future__ import annotations

from typing import Any

from django.core.signals import got_request_exception, request_finished, request_started
from django.db import models
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save
from django.utils import timezone

from .engine import request_finished as end_of_request
from .engine import request_started as start_of_request
from .engine import view_failed
from .models import Ban, Override, Rule, validate_row
from .rules import rules_changed
from .signals import rules_written


def rule_written(**kwargs: Any) -> None:
    rules_changed()


def raw_rule_saved(instance: Rule, raw: bool, **kwargs: Any) -> None:
    """loaddata saves without save(): an enabled rule is validated as the admin would."""
    if raw and instance.enabled:
        validate_row(instance, validate_unique=False)  # the table's constraint checks that


def raw_override_saved(instance: Override | Ban, raw: bool, **kwargs: Any) -> None:
    if raw:
        instance.full_clean(validate_unique=False)


def rule_touched(instance: Any, **kwargs: Any) -> None:
    """An override or a rule's groups changed: the rule's updated_at moves too, so processes
    that watch the rule table (no Redis: DatabaseVersion) reload as well."""
    pk = instance.rule_id if isinstance(instance, Override) else getattr(instance, "pk", None)
    if isinstance(instance, (Override, Rule)) and pk is not None:
        # The plain QuerySet.update: a timestamp needs no validation of the row.
        models.QuerySet.update(Rule.objects.filter(pk=pk), updated_at=timezone.now())
    rules_changed()


def connect() -> None:
    pre_save.connect(raw_rule_saved, sender=Rule, dispatch_uid="django_throttle.rule_loaded")
    post_save.connect(rule_written, sender=Rule, dispatch_uid="django_throttle.rule_saved")
    post_delete.connect(rule_written, sender=Rule, dispatch_uid="django_throttle.rule_deleted")
    pre_save.connect(
        raw_override_saved, sender=Override, dispatch_uid="django_throttle.override_loaded"
    )
    post_save.connect(rule_touched, sender=Override, dispatch_uid="django_throttle.override_saved")
    post_delete.connect(
        rule_touched, sender=Override, dispatch_uid="django_throttle.override_deleted"
    )
    # A ban is loaded with the rules: its writes are announced as theirs are.
    pre_save.connect(raw_override_saved, sender=Ban, dispatch_uid="django_throttle.ban_loaded")
    post_save.connect(rule_written, sender=Ban, dispatch_uid="django_throttle.ban_saved")
    post_delete.connect(rule_written, sender=Ban, dispatch_uid="django_throttle.ban_deleted")
    for through in (Rule.groups.through, Rule.exempt_groups.through):
        m2m_changed.connect(rule_touched, sender=through, dispatch_uid=f"django_throttle.{through}")
    rules_written.connect(rule_written, dispatch_uid="django_throttle.rules_written")
    request_started.connect(start_of_request, dispatch_uid="django_throttle.request_started")
    request_finished.connect(end_of_request, dispatch_uid="django_throttle.request_finished")
    # A view's exception answered with a 500: a cost settled in it does not apply.
    got_request_exception.connect(view_failed, dispatch_uid="django_throttle.view_failed")
