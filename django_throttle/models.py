"""The ``Rule`` model: one rate limit, edited in the admin."""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.utils import timezone
from django.utils.functional import Promise
from django.utils.translation import gettext, ngettext, pgettext
from django.utils.translation import gettext_lazy as _

from .choices import (
    ALGORITHMS_WITH_BURST,
    KEY_KINDS_WITH_ARG,
    Action,
    Algorithm,
    AppliesTo,
    FailMode,
    KeyKind,
    RejectionAction,
    Unit,
)
from .compiled import MAX_BLOCK, MAX_GROWTH, MAX_LIMIT
from .conf import conf
from .networks import canonical_networks, normalized
from .patterns import UnsafePattern, check_pattern
from .rates import (
    CALENDAR_UNITS,
    DAY,
    HOUR,
    MAX_PER,
    MAX_WINDOW,
    MINUTE,
    MONTH,
    SECOND,
    UNIT_SECONDS,
    count_of,
    describe,
    window_words,
)
from .signals import rules_written
from .statuses import HIGHEST, LOWEST, is_status_number, item_statuses, shown, status_items

__all__ = (
    "Action",
    "Algorithm",
    "Ban",
    "Dashboard",
    "FailMode",
    "KeyKind",
    "Override",
    "Rejection",
    "RejectionAction",
    "Rule",
    "Unit",
)

_METHOD_RE = re.compile(r"^[A-Z]+$")
_HEADER_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an RFC 9110 token
_SCOPE_NAME_RE = re.compile(r"^[^\s/^*][^\s]*$")
_M = TypeVar("_M", bound=models.Model)


class ValidatedQuerySet(models.QuerySet[_M]):
    """Bulk writes skip model signals and save(), so they validate like save() and announce
    the change themselves. An update is validated after the write (F() expressions are
    checked by their result) and rolled back with a ValidationError."""

    def validate(self, obj: _M) -> None:
        obj.full_clean()

    def to_validate(self, written: models.QuerySet[_M]) -> models.QuerySet[_M]:
        """The rows an update wrote that must still be valid."""
        return written

    def update(self, **kwargs: Any) -> int:
        with transaction.atomic(using=self.db):
            pks = list(self.values_list("pk", flat=True))
            count = super().update(**kwargs)
            written = self.model._default_manager.using(self.db).filter(pk__in=pks)
            for obj in self.to_validate(written):
                self.validate(obj)
        if count:
            _announce_change()
        return count

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list[_M]:
        objs = list(objs)
        for obj in objs:
            self.validate(obj)
        created = super().bulk_create(objs, *args, **kwargs)
        _announce_change()
        return created

    def bulk_update(self, objs: Any, fields: Any, *args: Any, **kwargs: Any) -> int:
        objs = list(objs)
        for obj in objs:
            self.validate(obj)
        count = super().bulk_update(objs, fields, *args, **kwargs)
        _announce_change()
        return count


class RuleQuerySet(ValidatedQuerySet["Rule"]):
    """Only enabled rules must stay valid: disabling a broken rule is always allowed."""

    def validate(self, obj: Rule) -> None:
        validate_row(obj)

    def to_validate(self, written: models.QuerySet[Rule]) -> models.QuerySet[Rule]:
        return written.filter(enabled=True)

    def update(self, **kwargs: Any) -> int:
        kwargs.setdefault("updated_at", timezone.now())
        return super().update(**kwargs)


def _announce_change() -> None:
    rules_written.send(sender=Rule)


def validate_row(rule: Rule, validate_unique: bool = True) -> None:
    """full_clean(), its errors naming the rule (a bulk write or a fixture may hold many)."""
    try:
        rule.full_clean(validate_unique=validate_unique)
    except ValidationError as exc:
        raise ValidationError(
            _("Rule %(name)r: %(errors)s") % {"name": rule.name, "errors": "; ".join(exc.messages)}
        ) from exc


class Rule(models.Model):
    name = models.CharField(
        _("name"),
        max_length=100,
        unique=True,
        help_text=_("A unique name, shown in headers and on the dashboard. Example: login."),
    )
    scope = models.CharField(
        _("scope"),
        max_length=255,
        help_text=_(
            "What the rule covers. '*' is every request; '/api/' a path prefix; "
            "'^/users/\\d+/$' a regular expression on the path; any other word a scope name: "
            "views decorated with @throttle('login') and URL patterns named 'login' "
            "(or 'namespace:name')."
        ),
    )
    methods = models.CharField(
        _("methods"),
        max_length=100,
        blank=True,
        help_text=_(
            "Comma-separated HTTP methods the rule counts, e.g. 'POST,PUT'. Empty = all. "
            "GET counts HEAD too (Django answers HEAD with the GET view)."
        ),
    )
    key_kind = models.CharField(
        _("key"),
        max_length=20,
        choices=KeyKind.choices,
        default=KeyKind.IP,
        help_text=_("Who gets a counter of their own: one per IP, per user, per header value, ..."),
    )
    key_arg = models.CharField(
        _("key argument"),
        max_length=100,
        blank=True,
        help_text=_(
            "For 'header': the header name (X-Api-Key). For 'param': the parameter (q). "
            "For 'custom': the name of a function in DJANGO_THROTTLE['KEY_FUNCTIONS'] (tenant)."
        ),
    )
    limit = models.IntegerField(
        _("limit"),
        validators=[
            MinValueValidator(1, _("The limit must allow at least 1 request.")),
            MaxValueValidator(MAX_LIMIT, _("The limit can be at most %(limit_value)s.")),
        ],
        help_text=_("Requests allowed per unit of time. Example: 5 (with unit minute)."),
    )
    per = models.PositiveIntegerField(
        _("per"),
        default=1,
        validators=[
            MinValueValidator(1, _("A window is at least 1 unit long.")),
            MaxValueValidator(MAX_PER, _("A window can be at most %(limit_value)s units long.")),
        ],
        help_text=_(
            "How many units the window lasts: 15 (with unit minute) for 100 per 15 minutes."
        ),
    )
    unit = models.CharField(
        _("unit"),
        max_length=10,
        choices=Unit.choices,
        default=Unit.MINUTE,
        help_text=_("The unit of time the limit is counted over."),
    )
    algorithm = models.CharField(
        _("algorithm"),
        max_length=30,
        choices=Algorithm.choices,
        default=Algorithm.SLIDING_WINDOW_COUNTER,
        help_text=_(
            "Sliding window counter is a good default; token bucket allows bursts; "
            "leaky bucket smooths traffic; sliding window log is exact and uses the most memory; "
            "fixed window is the cheapest."
        ),
    )
    burst = models.IntegerField(
        _("burst"),
        null=True,
        blank=True,
        validators=[
            MinValueValidator(1, _("The burst must be at least 1.")),
            MaxValueValidator(MAX_LIMIT, _("The burst can be at most %(limit_value)s.")),
        ],
        help_text=_(
            "Token and leaky bucket only: the bucket size, i.e. how many requests may come at "
            "once. Example: 20 with a limit of 5/second. Empty = the limit."
        ),
    )
    applies_to = models.CharField(
        _("applies to"),
        max_length=20,
        choices=AppliesTo.choices,
        default=AppliesTo.ALL,
        help_text=_("Whose requests the rule counts; 'groups' counts members of the groups below."),
    )
    groups = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="throttle_rules",
        verbose_name=_("groups"),
        help_text=_("With 'members of the chosen groups': the groups whose members it counts."),
    )
    exempt_staff = models.BooleanField(
        _("exempt staff"), default=False, help_text=_("Staff users are never counted.")
    )
    exempt_groups = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="throttle_exemptions",
        verbose_name=_("exempt groups"),
        help_text=_("Members of these groups are never counted."),
    )
    exempt_networks = models.TextField(
        _("exempt networks"),
        blank=True,
        help_text=_(
            "CIDRs never counted by this rule, comma- or newline-separated: 10.0.0.0/8, "
            "2001:db8::/32. (DJANGO_THROTTLE['EXEMPT_NETWORKS'] exempts from every rule.)"
        ),
    )
    block_seconds = models.PositiveIntegerField(
        _("block for (seconds)"),
        default=0,
        validators=[
            MaxValueValidator(MAX_BLOCK, _("A block can last at most %(limit_value)s seconds."))
        ],
        help_text=_(
            "Once this rule rejects a client, reject it for this many seconds, whatever the "
            "window says. Example: 3600 after 5 failed logins in 15 minutes. 0 = no block."
        ),
    )
    block_growth = models.PositiveIntegerField(
        _("block growth"),
        default=1,
        validators=[
            MinValueValidator(1),
            MaxValueValidator(MAX_GROWTH),
        ],
        help_text=_(
            "Each further block of a client that comes back while its last block is "
            "remembered (DJANGO_THROTTLE['BLOCK_MEMORY'], a day by default) lasts this many "
            "times the one before, up to 7 days. Example: 4 makes blocks of 60 s, 4, 16 and "
            "64 minutes. 1 = every block as long."
        ),
    )
    action = models.CharField(
        _("action"),
        max_length=10,
        choices=Action.choices,
        default=Action.REJECT,
        help_text=_(
            "Reject answers 429. Delay (leaky bucket only) holds the request until its turn. "
            "Log only records would-be rejections, to try a rule before enforcing it."
        ),
    )
    count_statuses = models.CharField(
        _("count only responses"),
        max_length=200,
        blank=True,
        default="",
        help_text=_(
            "Empty: every request counts. Else the statuses that count, comma-separated: "
            "401,403 (failed logins), 4xx, 5xx,429. The request is counted before the view; "
            "what it took is given back when its response has another status."
        ),
    )
    cost_header = models.CharField(
        _("cost from response header"),
        max_length=100,
        blank=True,
        default="",
        help_text=_(
            "A response header holding the request's actual cost, a whole number (tokens an "
            "LLM call used: X-Tokens-Used). The request takes its cost before the view (1 by "
            "default); the difference is charged or given back when the response ends. Empty: "
            "the cost taken stands. Not for concurrency rules."
        ),
    )
    fail_mode = models.CharField(
        _("when the store is down"),
        max_length=10,
        choices=FailMode.choices,
        default=FailMode.DEFAULT,
        help_text=_("Closed suits login and password reset; open suits a general API."),
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    objects = RuleQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        verbose_name = _("rate-limit rule")
        verbose_name_plural = _("rate-limit rules")

    def __str__(self) -> str:
        """``api: 10 per minute per ip, sliding window counter`` (in the active language: the
        lists and choices of the admin and the dashboard show it)."""
        algorithm = Algorithm(self.algorithm).label if self.algorithm in Algorithm.values else ""
        # One message for the sentence, so that a translator may put the key before the rate.
        text = pgettext(
            "a rule in one line: its name, rate, key and algorithm",
            "%(name)s: %(rate)s %(key)s, %(algorithm)s",
        ) % {
            "name": self.name,
            "rate": self.rate_description,
            "key": self.key_description,
            "algorithm": algorithm,
        }
        if self.burst:
            text += pgettext("a rule in one line", ", burst %(burst)s") % {"burst": self.burst}
        if self.action == Action.LOG:
            text += pgettext("a rule in one line", ", log")
        elif self.action == Action.DELAY:
            text += pgettext("a rule in one line", ", delay")
        if not self.enabled:
            text += pgettext("a rule in one line", " (disabled)")
        return text

    @property
    def explanation(self) -> str:
        """The rule in words, as the admin shows it: ``at most 100 requests per 15 minutes
        per client IP, then blocked for 1 hour; POST only; staff exempt`` (in the active
        language: each part is one message, so that a translator may reorder its words)."""
        values = {
            "limit": self.limit,
            "window": window_words(self.per, self.unit),
            "key": self.key_phrase,
        }
        if self.algorithm == Algorithm.CONCURRENCY:
            values["window"] = slot_words(self.per, self.unit)
            text = ngettext(
                "at most %(limit)s request in flight %(key)s (a slot lasts %(window)s at most)",
                "at most %(limit)s requests in flight %(key)s (a slot lasts %(window)s at most)",
                self.limit,
            )
        else:
            text = ngettext(
                "at most %(limit)s request per %(window)s %(key)s",
                "at most %(limit)s requests per %(window)s %(key)s",
                self.limit,
            )
        text %= values
        if self.burst and self.algorithm in ALGORITHMS_WITH_BURST:
            text += ngettext(
                ", in bursts of up to %(burst)s request",
                ", in bursts of up to %(burst)s requests",
                self.burst,
            ) % {"burst": self.burst}
        if self.unit in CALENDAR_UNITS:
            starts = (
                gettext("(counted from the 1st of a month, 00:00 %(zone)s)")
                if self.unit == MONTH
                else gettext("(counted from Monday, 00:00 %(zone)s)")
            )
            text += " " + starts % {"zone": conf.TIME_ZONE}
        if self.count_statuses:
            statuses = shown(self.count_statuses)
            text += gettext(", counting only responses %(statuses)s") % {"statuses": statuses}
        if self.block_seconds:
            text += gettext(", then blocked for %(duration)s") % {
                "duration": duration(self.block_seconds)
            }
            if self.block_growth > 1:
                text += gettext(", %(growth)s times longer each time it comes back") % {
                    "growth": self.block_growth
                }
        notes = []
        if self.methods:
            notes.append(gettext("%(methods)s only") % {"methods": self.methods.replace(",", ", ")})
        audience = {
            str(AppliesTo.ANONYMOUS): gettext("anonymous clients only"),
            str(AppliesTo.AUTHENTICATED): gettext("authenticated users only"),
            str(AppliesTo.GROUPS): gettext("members of chosen groups only"),
        }.get(self.applies_to)
        if audience:
            notes.append(audience)
        if self.exempt_staff:
            notes.append(gettext("staff exempt"))
        if self.exempt_networks:
            notes.append(
                gettext("%(networks)s exempt") % {"networks": self.exempt_networks.strip()}
            )
        if self.action == Action.LOG:
            notes.append(gettext("logged only, never rejected"))
        elif self.action == Action.DELAY:
            notes.append(gettext("delayed to its turn rather than rejected"))
        return pgettext("between the parts of a rule in words", "; ").join([text, *notes])

    @property
    def key_phrase(self) -> str:
        kind = self.key_kind
        arg = {"arg": self.key_arg}
        if kind == KeyKind.IP:
            return gettext("per client IP")
        if kind == KeyKind.USER:
            return gettext("per user (anonymous requests not counted)")
        if kind == KeyKind.USER_OR_IP:
            return gettext("per user, or per IP when anonymous")
        if kind == KeyKind.GLOBAL:
            return gettext("for all clients together")
        if kind == KeyKind.HEADER:
            return gettext("per value of the %(arg)s header") % arg
        if kind == KeyKind.PARAM:
            return gettext("per value of the %(arg)s parameter") % arg
        if kind == KeyKind.CUSTOM:
            return gettext("per %(arg)s (a key function)") % arg
        return gettext("per %(arg)s") % {"arg": kind}

    @property
    def rate_description(self) -> str:
        """``100 per 15 minutes``; ``3 in flight`` for a concurrency rule."""
        if self.algorithm == Algorithm.CONCURRENCY:
            return gettext("%(limit)s in flight") % {"limit": self.limit}
        return describe(self.limit, self.per, self.unit)

    @property
    def key_description(self) -> str:
        """``per ip``, ``per header X-Api-Key``: the key as the rule's one line says it."""
        arg = {"arg": self.key_arg}
        # Literal contexts: makemessages finds a pgettext() only by its literal arguments.
        phrases: dict[str, str] = {
            KeyKind.IP: pgettext("a rule's key in one line", "per ip"),
            KeyKind.USER: pgettext("a rule's key in one line", "per user"),
            KeyKind.USER_OR_IP: pgettext("a rule's key in one line", "per user or ip"),
            KeyKind.GLOBAL: pgettext("a rule's key in one line", "shared by all"),
            KeyKind.HEADER: pgettext("a rule's key in one line", "per header %(arg)s") % arg,
            KeyKind.PARAM: pgettext("a rule's key in one line", "per param %(arg)s") % arg,
            KeyKind.CUSTOM: pgettext("a rule's key in one line", "per custom %(arg)s") % arg,
        }
        return phrases.get(self.key_kind) or gettext("per %(arg)s") % {"arg": self.key_kind}

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Every code path that saves a rule validates it, not only the admin.
        self.full_clean()
        super().save(*args, **kwargs)

    def clean(self) -> None:
        self.scope = (self.scope or "").strip()
        self.key_arg = (self.key_arg or "").strip()
        methods = (m.strip().upper() for m in (self.methods or "").split(","))
        self.methods = ",".join(dict.fromkeys(m for m in methods if m))
        errors: dict[str, list[str | Promise]] = {}

        def error(field: str, message: str | Promise) -> None:
            errors.setdefault(field, []).append(message)

        scope_error = scope_problem(self.scope)
        if scope_error:
            error("scope", scope_error)
        for method in filter(None, self.methods.split(",")):
            if not _METHOD_RE.match(method):
                error(
                    "methods",
                    _("%(m)r is not an HTTP method; write e.g. GET,POST.") % {"m": method},
                )

        if self.key_kind in KEY_KINDS_WITH_ARG:
            if not self.key_arg:
                error("key_arg", _key_arg_missing(self.key_kind))
            elif self.key_kind == KeyKind.HEADER and not _HEADER_RE.match(self.key_arg):
                error("key_arg", _("%(h)r is not a valid header name.") % {"h": self.key_arg})
            elif self.key_kind == KeyKind.CUSTOM and self.key_arg not in conf.KEY_FUNCTIONS:
                names = ", ".join(sorted(conf.KEY_FUNCTIONS))
                known = (
                    _("registered: %(names)s") % {"names": names}
                    if names
                    else str(_("none is registered"))
                )
                error(
                    "key_arg",
                    _(
                        "No key function named %(name)r in DJANGO_THROTTLE['KEY_FUNCTIONS'] "
                        "(%(known)s)."
                    )
                    % {"name": self.key_arg, "known": known},
                )
        elif self.key_arg:
            error(
                "key_arg", _("Only header, param and custom keys take an argument; leave it empty.")
            )

        if self.burst is not None and self.algorithm not in ALGORITHMS_WITH_BURST:
            error(
                "burst",
                _("Only token bucket and leaky bucket have a burst; leave it empty for %(a)s.")
                % {"a": self.get_algorithm_display()},
            )
        if self.action == Action.DELAY and self.algorithm != Algorithm.LEAKY_BUCKET:
            error("action", _("Delay works with the leaky bucket algorithm only."))
        if self.unit in CALENDAR_UNITS and self.algorithm != Algorithm.FIXED_WINDOW:
            error(
                "algorithm",
                _(
                    "Weeks and months are calendar windows, counted by the fixed window "
                    "algorithm only."
                ),
            )
        try:
            # One spelling, the one a rule file writes: an export imported again is unchanged.
            self.exempt_networks = canonical_networks(self.exempt_networks or "")
        except ValueError as exc:
            error("exempt_networks", str(exc))
        for message in self._statuses_problems():
            error("count_statuses", message)
        if isinstance(self.block_growth, int) and self.block_growth > 1 and not self.block_seconds:
            error("block_growth", _("Growth lengthens blocks: set a block duration first."))
        self.cost_header = (self.cost_header or "").strip()
        if self.cost_header:
            if not _HEADER_RE.match(self.cost_header):
                error(
                    "cost_header", _("%(h)r is not a valid header name.") % {"h": self.cost_header}
                )
            elif self.algorithm == Algorithm.CONCURRENCY:
                error(
                    "cost_header",
                    _("A concurrency rule counts requests in flight, not costs; leave it empty."),
                )
        seconds = UNIT_SECONDS.get(self.unit)
        if seconds and isinstance(self.per, int) and self.per * seconds > MAX_WINDOW:
            error(
                "per", _("A window can last at most %(days)s days.") % {"days": MAX_WINDOW // 86400}
            )
        if errors:
            raise ValidationError(errors)

    def _statuses_problems(self) -> list[str | Promise]:
        """What is wrong with count_statuses, which clean() writes as the rule keeps it."""
        items = status_items(self.count_statuses or "")
        self.count_statuses = ",".join(items)
        problems: list[str | Promise] = []
        for item in items:
            try:
                item_statuses(item)
            except ValueError:
                if is_status_number(item):
                    problems.append(
                        _("%(s)s is not an HTTP status: statuses run from %(low)s to %(high)s.")
                        % {"s": item, "low": LOWEST, "high": HIGHEST}
                    )
                else:
                    problems.append(
                        _(
                            "%(s)r is neither a status nor a class of statuses; write e.g. "
                            "401,403 or 4xx or 5xx,429."
                        )
                        % {"s": item}
                    )
        if items and self.algorithm == Algorithm.CONCURRENCY:
            problems.append(
                _(
                    "A concurrency rule counts every request in flight, whatever its status: "
                    "leave this empty."
                )
            )
        return problems


def duration(seconds: int) -> str:
    """``1 hour``, ``90 seconds``, ``2 days``: the largest unit that divides it."""
    for unit, size in ((DAY, 86400), (HOUR, 3600), (MINUTE, 60)):
        if seconds % size == 0:
            return count_of(seconds // size, unit)
    return count_of(seconds, SECOND)


def slot_words(per: int, unit: str) -> str:
    """``a minute``, ``10 minutes``: how long a concurrency slot lasts at most."""
    if per != 1:
        return count_of(per, unit)
    words = {
        SECOND: gettext("a second"),
        MINUTE: gettext("a minute"),
        HOUR: gettext("an hour"),
        DAY: gettext("a day"),
    }
    return words.get(unit, count_of(1, unit))


def scope_problem(scope: str) -> str | None:
    """Why a scope string is unusable, or None if it is fine."""
    if not scope:
        return str(_("Enter a scope: '*', a path prefix, a ^regex or a scope name."))
    if scope == "*" or scope.startswith("/"):
        return None
    if scope.startswith("^"):
        try:
            check_pattern(scope)
        except UnsafePattern as exc:
            return str(_("Invalid regular expression: %(err)s.") % {"err": exc})
        return None
    if not _SCOPE_NAME_RE.match(scope):
        if scope.startswith("*"):
            return str(_("'*' alone covers every request; a scope name cannot start with '*'."))
        return str(_("A scope name cannot contain spaces."))
    return None


def _key_arg_missing(kind: str) -> str | Promise:
    messages: dict[str, str | Promise] = {
        KeyKind.HEADER: _("Name the header to key on, e.g. X-Api-Key."),
        KeyKind.PARAM: _("Name the query or form parameter to key on, e.g. api_key."),
        KeyKind.CUSTOM: _("Name the key function to use, as registered in KEY_FUNCTIONS."),
    }
    return messages[kind]


# -- overrides for one client --------------------------------------------------------

# A kind (ip, user, header, param, custom, or one of check_key()'s: tenant, partner...), a
# colon, a value.
_OVERRIDE_KEY_RE = re.compile(r"^[a-z][a-z0-9_.-]*:.")


class OverrideQuerySet(ValidatedQuerySet["Override"]):
    pass


class Override(models.Model):
    """One client's own limit on a rule, or its exemption from it, loaded with the rules."""

    rule = models.ForeignKey(
        Rule, on_delete=models.CASCADE, related_name="overrides", verbose_name=_("rule")
    )
    key = models.CharField(
        _("client key"),
        max_length=255,
        help_text=_(
            "As the dashboard writes it: user:42, ip:203.0.113.7 (IPv6: its network, as keyed), "
            "header:<value>, param:<value>, custom:<value>, or global."
        ),
    )
    limit = models.PositiveIntegerField(
        _("limit"),
        null=True,
        blank=True,
        validators=[
            MinValueValidator(1, _("The limit must allow at least 1 request.")),
            MaxValueValidator(MAX_LIMIT, _("The limit can be at most %(limit_value)s.")),
        ],
        help_text=_("This client's limit per the rule's window. Empty when exempt."),
    )
    exempt = models.BooleanField(_("exempt"), default=False)
    expires_at = models.DateTimeField(
        _("expires"),
        null=True,
        blank=True,
        help_text=_("When this override stops applying. Empty: never."),
    )

    class Meta:
        ordering = ["rule__name", "key"]
        verbose_name = _("override")
        verbose_name_plural = _("overrides")
        constraints = [
            models.UniqueConstraint(fields=["rule", "key"], name="django_throttle_one_override")
        ]

    def __str__(self) -> str:
        what = _("exempt") if self.exempt else _("limit %(n)s") % {"n": self.limit}
        return f"{self.key}: {what}"

    objects = OverrideQuerySet.as_manager()

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.full_clean()
        super().save(*args, **kwargs)

    @staticmethod
    def keyed(key: str) -> str:
        """The key as identities write it (an ``ip:`` key normalized), else as given."""
        key = key.strip()
        if key.startswith("ip:"):
            address = keyed_address(key[3:])
            if address is not None:
                return "ip:" + address
        return key

    def clean(self) -> None:
        self.key = (self.key or "").strip()
        errors: dict[str, str | Promise] = {}
        kind = self.key.split(":", 1)[0]
        if self.key != "global" and not _OVERRIDE_KEY_RE.match(self.key):
            errors["key"] = _(
                "Write the key as the dashboard does: user:42, ip:203.0.113.7, header:<value>, "
                "param:<value>, custom:<value> or global; or as your code passes it to "
                "check_key(): partner:acme."
            )
        elif kind == "ip":
            address = keyed_address(self.key[3:])
            if address is None:
                errors["key"] = _("%(v)r is not an IP address.") % {"v": self.key[3:]}
            else:
                self.key = "ip:" + address  # as identities key it: IPv6 by its network
        if self.exempt and self.limit is not None:
            errors["limit"] = _("An exempt client has no limit: leave it empty.")
        elif not self.exempt and self.limit is None:
            errors["limit"] = _("Give this client's limit, or make it exempt.")
        if errors:
            raise ValidationError(errors)


def keyed_address(text: str) -> str | None:
    """An address, or an IPv6 network of the keyed prefix length, as identities write it."""
    address = normalized(text, conf.IPV6_PREFIX)
    if address is None:
        try:
            network = ipaddress.ip_network(text.strip(), strict=False)
        except ValueError:
            return None
        if network.version == 6 and network.prefixlen == conf.IPV6_PREFIX:
            address = str(network)
    return address


# -- bans ----------------------------------------------------------------------------------

# The kinds a ban names a client by, as identities key them (ip takes networks too).
BAN_KINDS = ("ip", "user", "header", "param")


class BanQuerySet(ValidatedQuerySet["Ban"]):
    pass


class Ban(models.Model):
    """A client refused everywhere (403) by ThrottleMiddleware, before any rule."""

    key = models.CharField(
        _("client key"),
        max_length=255,
        help_text=_(
            "As the dashboard writes it: ip:203.0.113.7, a network ip:203.0.113.0/24 or "
            "ip:2001:db8::/48, user:42, header:<value> or param:<value>."
        ),
    )
    reason = models.TextField(_("reason"), blank=True)
    expires_at = models.DateTimeField(
        _("expires"),
        null=True,
        blank=True,
        help_text=_("When this ban stops applying. Empty: never."),
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    # What processes without Redis watch to see a ban changed (DatabaseVersion).
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    objects = BanQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "key"]
        verbose_name = _("ban")
        verbose_name_plural = _("bans")
        constraints = [models.UniqueConstraint(fields=["key"], name="django_throttle_one_ban")]

    def __str__(self) -> str:
        return self.key

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.full_clean()
        super().save(*args, **kwargs)

    def clean(self) -> None:
        try:
            self.key = Ban.keyed(self.key or "")
        except ValueError as exc:
            raise ValidationError({"key": str(exc)}) from None

    @staticmethod
    def keyed(key: str) -> str:
        """The key as the ban index reads it (an address as identities key it, a network in
        its canonical spelling); raise ValueError saying what is wrong with it."""
        key = key.strip()
        kind, colon, value = key.partition(":")
        value = value.strip()
        if not colon or kind not in BAN_KINDS or not value:
            raise ValueError(
                gettext(
                    "Write the key as the dashboard does: ip:203.0.113.7, a network "
                    "ip:203.0.113.0/24, user:42, header:<value> or param:<value>."
                )
            )
        if kind != "ip":
            return f"{kind}:{value}"
        if "/" not in value:
            address = keyed_address(value)
            if address is None:
                raise ValueError(gettext("%(v)r is not an IP address.") % {"v": value})
            return "ip:" + address
        try:
            network = ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise ValueError(
                gettext("%(v)r is not an IP network (write e.g. 203.0.113.0/24).") % {"v": value}
            ) from None
        if network.version == 4 and network.prefixlen == 32:
            return f"ip:{network.network_address}"
        if network.version == 6 and network.prefixlen > conf.IPV6_PREFIX:
            # Clients are keyed by their IPv6 network: a narrower ban could never match one.
            raise ValueError(
                gettext(
                    "IPv6 clients are told apart by their /%(n)d network: ban that network "
                    "or a wider one."
                )
                % {"n": conf.IPV6_PREFIX}
            )
        return f"ip:{network}"

    def in_force(self, now: datetime | None = None) -> bool:
        return self.expires_at is None or self.expires_at > (now or timezone.now())


# -- the rejection log -----------------------------------------------------------------


class Rejection(models.Model):
    """Rejections of one client under one rule in one minute, counted in bulk; once older than
    the dashboard's hour (day), in one quarter hour (two hours). See rejection_log."""

    rule = models.CharField(_("rule"), max_length=100)
    key = models.CharField(_("key digest"), max_length=16)  # digest(identity), as the store keys it
    display = models.CharField(_("client"), max_length=100)  # readable and truncated
    action = models.CharField(_("action"), max_length=12, choices=RejectionAction.choices)
    minute = models.DateTimeField(_("minute"))  # where the period starts
    # Its length: 1, 15, 120. A default in the database too: processes of the previous version
    # keep writing rows during a rolling deploy.
    minutes = models.PositiveSmallIntegerField(_("minutes"), default=1, db_default=1)
    count = models.PositiveBigIntegerField(_("count"), default=0)

    class Meta:
        verbose_name = _("rejection")
        verbose_name_plural = _("rejections")
        default_permissions = ()  # seen through the dashboard, whose permission is its own
        constraints = [
            models.UniqueConstraint(
                fields=["rule", "key", "action", "minute"], name="django_throttle_rejection_once"
            )
        ]
        indexes = [
            models.Index(fields=["minute"], name="django_throttle_rej_minute"),
            # The dashboard filtered by rule.
            models.Index(fields=["rule", "minute"], name="django_throttle_rej_rule"),
            # Compaction finds the rows still to merge without reading the merged ones.
            models.Index(fields=["minutes", "minute"], name="django_throttle_rej_length"),
        ]

    def __str__(self) -> str:
        return (
            f"{self.rule} {self.display} {self.action} {self.minute:%Y-%m-%d %H:%M}: {self.count}"
        )


class SizingCount(models.Model):
    """Per rule and hour, how many client windows reached a count (a boundary of
    rejection_log.sizing), or (``reached`` 0) the requests past the rule's own limit."""

    rule = models.CharField(_("rule"), max_length=100)
    hour = models.DateTimeField(_("hour"))  # the hour in which the client's window ends
    reached = models.PositiveIntegerField(_("count reached"))
    count = models.PositiveBigIntegerField(_("count"), default=0)

    class Meta:
        verbose_name = _("sizing count")
        verbose_name_plural = _("sizing counts")
        default_permissions = ()  # seen through the dashboard, whose permission is its own
        constraints = [
            models.UniqueConstraint(
                fields=["rule", "hour", "reached"], name="django_throttle_sizing_once"
            )
        ]
        indexes = [models.Index(fields=["hour"], name="django_throttle_sizing_hour")]

    def __str__(self) -> str:
        return f"{self.rule} {self.hour:%Y-%m-%d %H}h >= {self.reached}: {self.count}"


class Dashboard(Rejection):
    """The admin dashboard's entry (/admin/django_throttle/dashboard/) and its permission."""

    class Meta:
        proxy = True
        verbose_name = _("dashboard")
        verbose_name_plural = _("dashboard")
        default_permissions = ("view",)
