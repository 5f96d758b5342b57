"""The choices of a rule's fields, and the sets derived from them (no models imported)."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .rates import DAY, HOUR, MINUTE, MONTH, SECOND, WEEK


class Unit(models.TextChoices):
    SECOND = SECOND, _("second")
    MINUTE = MINUTE, _("minute")
    HOUR = HOUR, _("hour")
    DAY = DAY, _("day")
    WEEK = WEEK, _("calendar week, from Monday 00:00")
    MONTH = MONTH, _("calendar month, from the 1st 00:00")


class AppliesTo(models.TextChoices):
    ALL = "all", _("everyone")
    ANONYMOUS = "anonymous", _("anonymous clients only")
    AUTHENTICATED = "authenticated", _("authenticated users only")
    GROUPS = "groups", _("members of the chosen groups")


class KeyKind(models.TextChoices):
    IP = "ip", _("client IP address")
    USER = "user", _("authenticated user")
    USER_OR_IP = "user_or_ip", _("user, or IP when anonymous")
    HEADER = "header", _("request header")
    PARAM = "param", _("query or form parameter")
    GLOBAL = "global", _("one counter for everyone")
    CUSTOM = "custom", _("custom key function")


class Algorithm(models.TextChoices):
    TOKEN_BUCKET = "token_bucket", _("token bucket")
    LEAKY_BUCKET = "leaky_bucket", _("leaky bucket")
    FIXED_WINDOW = "fixed_window", _("fixed window")
    SLIDING_WINDOW_LOG = "sliding_window_log", _("sliding window log")
    SLIDING_WINDOW_COUNTER = "sliding_window_counter", _("sliding window counter")
    CONCURRENCY = "concurrency", _("concurrency (requests in flight)")


class Action(models.TextChoices):
    REJECT = "reject", _("reject with 429")
    DELAY = "delay", _("delay until the slot (leaky bucket)")
    LOG = "log", _("log only (shadow mode)")


class FailMode(models.TextChoices):
    DEFAULT = "default", _("as the FAIL_OPEN setting says")
    OPEN = "open", _("open: admit while the store is down")
    CLOSED = "closed", _("closed: answer 503 while the store is down")


class RejectionAction(models.TextChoices):
    REJECT = "reject", _("rejected (429)")
    UNAVAILABLE = "unavailable", _("store down, failed closed (503)")
    SHADOW = "shadow", _("would reject (log-only rule)")


KEY_KINDS_WITH_ARG = frozenset({KeyKind.HEADER, KeyKind.PARAM, KeyKind.CUSTOM})
ALGORITHMS_WITH_BURST = frozenset({Algorithm.TOKEN_BUCKET, Algorithm.LEAKY_BUCKET})
# Key kinds a @throttle code default may use: they need no argument.
CODE_KEY_KINDS = (KeyKind.IP, KeyKind.USER, KeyKind.USER_OR_IP, KeyKind.GLOBAL)
