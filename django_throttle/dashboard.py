"""The admin dashboard: who is being limited, by which rule, and a key's state with a reset.

``/admin/django_throttle/dashboard/`` is the changelist of the proxy model ``Dashboard``,
so it appears on the admin index and has a permission of its own
(``django_throttle.view_dashboard``): a site can give support staff the dashboard without
rule editing. Resetting a key takes the permission to change rules, and is written to the
admin log against the rule. Charts are SVG drawn on the server, so the page works offline
and without JavaScript; ``data/`` serves the same figures as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth import get_permission_codename, get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import F, Max, QuerySet, Sum
from django.db.models.functions import TruncHour
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import dateformat, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from .conf import conf
from .models import Rejection, Rule
from .recording import ACTIONS, SHADOW, UNAVAILABLE, is_complete
from .rules import compile_rule
from .store import Check, get_store
from .store.fallback import STORE_ERRORS


@dataclass(frozen=True)
class Period:
    span: timedelta
    bucket: int  # seconds per point of the chart
    label: Any
    tick_format: str  # django.utils.dateformat


PERIODS = {
    "hour": Period(timedelta(hours=1), 60, _("last hour"), "H:i"),
    "day": Period(timedelta(days=1), 15 * 60, _("last day"), "H:i"),
    "week": Period(timedelta(days=7), 2 * 3600, _("last week"), "D H:i"),
}
DEFAULT_PERIOD = "hour"
MAX_SERIES = 8  # rules drawn one by one; the rest are summed as "other rules"
TOP_KEYS = 20
RECENT = 20
PALETTE = (
    "#2a78b5",
    "#d1495b",
    "#3a9b5c",
    "#e8a33d",
    "#7a5195",
    "#00a5a8",
    "#c7622b",
    "#5c6b73",
    "#999999",
)
OTHER_RULES = "(other rules)"


# -- the figures ------------------------------------------------------------------------


def dashboard_data(rule: str | None, period: str, now: datetime | None = None) -> dict[str, Any]:
    """Everything the dashboard shows, for one rule (None: all) over one period."""
    spec = PERIODS[period]
    now = now or timezone.now()
    epoch = _epoch(now)
    end_epoch = (epoch // spec.bucket + 1) * spec.bucket
    n = int(spec.span.total_seconds()) // spec.bucket
    start_epoch = end_epoch - n * spec.bucket
    start, end = _datetime(start_epoch), _datetime(end_epoch)
    rows = Rejection.objects.filter(minute__gte=start, minute__lt=end)
    if rule:
        rows = rows.filter(rule=rule)

    totals: dict[str, dict[str, int]] = {}
    for row in rows.values("rule", "action").annotate(total=Sum("count")):
        figures = totals.setdefault(row["rule"], dict.fromkeys((*ACTIONS, "total"), 0))
        figures[row["action"]] += row["total"]
        figures["total"] += row["total"]
    by_total = sorted(totals, key=lambda name: (-totals[name]["total"], name))

    drawn = by_total[:MAX_SERIES]
    series = {name: [0] * n for name in drawn}
    if len(by_total) > MAX_SERIES:
        series[OTHER_RULES] = [0] * n
    if spec.bucket >= 3600:  # a week: the database sums per hour, not per minute
        tz = dt_timezone.utc if settings.USE_TZ else None
        points = rows.annotate(at=TruncHour("minute", tzinfo=tz))
    else:
        points = rows.annotate(at=F("minute"))
    for row in points.values("rule", "at").annotate(total=Sum("count")):
        index = (_epoch(row["at"]) - start_epoch) // spec.bucket
        if 0 <= index < n:
            name = row["rule"] if row["rule"] in series else OTHER_RULES
            series[name][index] += row["total"]

    top = rows.values("rule", "key", "display").annotate(total=Sum("count"), last=Max("minute"))
    top_keys = list(top.order_by("-total", "rule", "display")[:TOP_KEYS])
    recent = list(
        rows.order_by("-minute", "-count", "rule").values(
            "minute", "rule", "key", "display", "action", "count"
        )[:RECENT]
    )
    return {
        "period": period,
        "rule": rule or None,
        "start": start,
        "end": end,
        "bucket_seconds": spec.bucket,
        "buckets": [_datetime(start_epoch + i * spec.bucket) for i in range(n)],
        "series": [{"rule": name, "counts": counts} for name, counts in series.items()],
        "totals": [{"rule": name, **totals[name]} for name in by_total],
        "top_keys": top_keys,
        "recent": recent,
    }


def _datetime(epoch: int) -> datetime:
    value = datetime.fromtimestamp(epoch, tz=dt_timezone.utc)
    return value if settings.USE_TZ else timezone.make_naive(value)


def _epoch(value: datetime) -> int:
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return int(value.timestamp())


def _local(value: datetime) -> datetime:
    return timezone.localtime(value) if timezone.is_aware(value) else value


# -- the chart ----------------------------------------------------------------------------

WIDTH, HEIGHT = 900, 240
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 12, 26


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... at least value."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def chart_svg(data: dict[str, Any], tick_format: str) -> SafeString:
    """Rejections over time, one line per rule, as inline SVG."""
    buckets = data["buckets"]
    n = len(buckets)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    peak = max((max(s["counts"]) for s in data["series"]), default=0)
    top = _nice_ceiling(max(peak, 1))

    def x(i: int) -> float:
        return LEFT + plot_w * i / max(n - 1, 1)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    parts = []
    for value in (0, top / 2, top):
        label = f"{value:g}"
        parts.append(
            format_html(
                '<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                '<text class="axis" x="{}" y="{}" text-anchor="end">{}</text>',
                LEFT,
                WIDTH - RIGHT,
                f"{y(value):.1f}",
                f"{y(value):.1f}",
                LEFT - 6,
                f"{y(value) + 4:.1f}",
                label,
            )
        )
    for i in sorted({0, n // 2, n - 1}) if n else ():
        anchor = "start" if i == 0 else "end" if i == n - 1 else "middle"
        parts.append(
            format_html(
                '<text class="axis" x="{}" y="{}" text-anchor="{}">{}</text>',
                f"{x(i):.1f}",
                HEIGHT - 6,
                anchor,
                dateformat.format(_local(buckets[i]), tick_format),
            )
        )
    for number, item in enumerate(data["series"]):
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(item["counts"]))
        parts.append(
            format_html(
                '<polyline class="series" data-rule="{}" stroke="{}" points="{}">'
                "<title>{}: {}</title></polyline>",
                item["rule"],
                PALETTE[number % len(PALETTE)],
                points,
                item["rule"],
                sum(item["counts"]),
            )
        )
    label = _("Rejections over time per rule")
    return format_html(
        '<svg class="throttle-chart" viewBox="0 0 {} {}" role="img" aria-label="{}" '
        'xmlns="http://www.w3.org/2000/svg">{}</svg>',
        WIDTH,
        HEIGHT,
        label,
        mark_safe("".join(parts)),  # each part built with format_html
    )


def legend(data: dict[str, Any]) -> SafeString:
    return format_html_join(
        "",
        '<li><span class="swatch" style="background:{}"></span>{} <small>({})</small></li>',
        (
            (PALETTE[i % len(PALETTE)], item["rule"], sum(item["counts"]))
            for i, item in enumerate(data["series"])
        ),
    )


# -- forms --------------------------------------------------------------------------------


class KeyForm(forms.Form):
    rule = forms.ModelMultipleChoiceField(
        queryset=Rule.objects.all(),
        label=_("Rules"),
        widget=forms.SelectMultiple(attrs={"size": 6}),
    )
    key = forms.CharField(
        label=_("Client key"),
        max_length=2000,
        strip=True,
        help_text=_("As the dashboard shows it: ip:203.0.113.7, user:42, header:VALUE, global."),
        widget=forms.TextInput(attrs={"size": 40, "placeholder": "ip:203.0.113.7"}),
    )


class ResetForm(forms.Form):
    rule = forms.ModelChoiceField(queryset=Rule.objects.all())
    key = forms.CharField(max_length=2000, strip=True)


KEY_PREFIXES = {
    "ip": ("ip:",),
    "user": ("user:",),
    "user_or_ip": ("user:", "ip:"),
    "header": ("header:",),
    "param": ("param:",),
    "custom": ("custom:",),
}


def key_mismatch(rule: Rule, key: str) -> str | None:
    """Why this key cannot be one the rule counts, or None."""
    if rule.key_kind == "global":
        return None if key == "global" else str(_("This rule has one key for everyone: global."))
    prefixes = KEY_PREFIXES.get(rule.key_kind, ())
    if prefixes and not key.startswith(prefixes):
        return str(_("This rule counts keys written %(p)s...")) % {"p": " or ".join(prefixes)}
    return None


# -- the admin ------------------------------------------------------------------------------


class DashboardAdmin(admin.ModelAdmin):
    """No list, no forms: the changelist is the dashboard."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def can_reset(self, request: HttpRequest) -> bool:
        opts = Rule._meta
        return request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}")

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "data/", self.admin_site.admin_view(self.data_view), name="{}_{}_data".format(*info)
            ),
            path("key/", self.admin_site.admin_view(self.key_view), name="{}_{}_key".format(*info)),
            *super().get_urls(),
        ]

    def _require_view(self, request: HttpRequest) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied

    def _filters(self, request: HttpRequest) -> tuple[str | None, str]:
        period = request.GET.get("period", DEFAULT_PERIOD)
        if period not in PERIODS:
            period = DEFAULT_PERIOD
        return (request.GET.get("rule") or None), period

    def _context(self, request: HttpRequest, title: Any, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "subtitle": None,
            "key_url": reverse("admin:django_throttle_dashboard_key"),
            "dashboard_url": reverse("admin:django_throttle_dashboard_changelist"),
            **extra,
        }

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        self._require_view(request)
        rule, period = self._filters(request)
        data = dashboard_data(rule, period)
        rule_ids = dict(Rule.objects.values_list("name", "pk"))
        names = sorted(
            set(rule_ids) | {t["rule"] for t in data["totals"]} | ({rule} if rule else set())
        )
        usernames = _usernames([*data["top_keys"], *data["recent"]])
        for row in [*data["top_keys"], *data["recent"]]:
            row["client"] = row["display"]
            if row["display"] in usernames:
                row["client"] = f"{row['display']} ({usernames[row['display']]})"
            rule_id = rule_ids.get(row["rule"])
            row["inspect_url"] = (
                reverse("admin:django_throttle_dashboard_key")
                + "?"
                + urlencode({"rule": rule_id, "key": row["display"]})
                if rule_id is not None and is_complete(row["display"], row["key"])
                else None
            )
        for row in data["recent"]:
            row["action_label"] = ACTION_LABELS[row["action"]]
        periods = [
            (
                name,
                spec.label,
                "?" + urlencode({k: v for k, v in (("rule", rule), ("period", name)) if v}),
            )
            for name, spec in PERIODS.items()
        ]
        context = self._context(
            request,
            _("Rate-limiting dashboard"),
            data=data,
            chart=chart_svg(data, PERIODS[period].tick_format),
            legend=legend(data),
            rule=rule,
            rule_names=names,
            period=period,
            period_label=PERIODS[period].label,
            periods=periods,
            bucket_minutes=PERIODS[period].bucket // 60,
            data_url=reverse("admin:django_throttle_dashboard_data")
            + "?"
            + urlencode({k: v for k, v in (("rule", rule), ("period", period)) if v}),
            key_form=KeyForm(),
            flush_interval=conf.FLUSH_INTERVAL,
            retention_days=conf.RETENTION_DAYS,
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/django_throttle/dashboard.html", context)

    def data_view(self, request: HttpRequest) -> JsonResponse:
        self._require_view(request)
        rule, period = self._filters(request)
        return JsonResponse(dashboard_data(rule, period), encoder=DjangoJSONEncoder)

    def key_view(self, request: HttpRequest) -> HttpResponse:
        """GET: the state of a key under some rules, read without consuming. POST: reset it."""
        self._require_view(request)
        if request.method == "POST":
            return self._reset(request)
        form = KeyForm(request.GET if "key" in request.GET else None, initial=_initial(request))
        states = []
        if form.is_bound and form.is_valid():
            states = _states(list(form.cleaned_data["rule"]), form.cleaned_data["key"])
        context = self._context(
            request,
            _("Inspect a client key"),
            form=form,
            key=form.cleaned_data["key"] if form.is_bound and form.is_valid() else "",
            states=states,
            can_reset=self.can_reset(request),
        )
        return TemplateResponse(request, "admin/django_throttle/dashboard_key.html", context)

    def _reset(self, request: HttpRequest) -> HttpResponse:
        if not self.can_reset(request):
            raise PermissionDenied
        form = ResetForm(request.POST)
        if not form.is_valid():
            messages.error(request, _("Choose a rule and a key to reset."))
            return HttpResponseRedirect(reverse("admin:django_throttle_dashboard_key"))
        rule, key = form.cleaned_data["rule"], form.cleaned_data["key"]
        back = (
            reverse("admin:django_throttle_dashboard_key")
            + "?"
            + urlencode({"rule": rule.pk, "key": key})
        )
        try:
            get_store().reset(compile_rule(rule), key)
        except STORE_ERRORS as exc:
            messages.error(
                request, _("The store is unavailable (%(e)s); nothing was reset.") % {"e": exc}
            )
            return HttpResponseRedirect(back)
        except Exception as exc:  # a rule that cannot be compiled (e.g. a key function removed)
            messages.error(request, _("This rule cannot be used: %(e)s") % {"e": exc})
            return HttpResponseRedirect(back)
        message = _("Reset the state of client key %(key)s.") % {"key": key}
        LogEntry.objects.log_actions(
            user_id=request.user.pk,
            queryset=[rule],
            action_flag=CHANGE,
            change_message=str(message),
            single_object=True,
        )
        messages.success(
            request,
            _("Client key %(key)s reset under rule %(rule)s.") % {"key": key, "rule": rule.name},
        )
        return HttpResponseRedirect(back)


ACTION_LABELS = {
    "reject": _("rejected (429)"),
    UNAVAILABLE: _("failed closed (503)"),
    SHADOW: _("shadow"),
}


def _initial(request: HttpRequest) -> dict[str, Any]:
    return {"rule": request.GET.getlist("rule")}


@dataclass
class KeyState:
    rule: Rule
    limit: int | None = None
    remaining: int | None = None
    reset_at: datetime | None = None
    retry_after: float | None = None
    allowed: bool | None = None
    error: str | None = None
    warning: str | None = None


def _states(rules: list[Rule], key: str) -> list[KeyState]:
    """Each rule's state for this key, in one store call that consumes nothing."""
    states, checks = [], []
    for rule in rules:
        state = KeyState(rule, warning=key_mismatch(rule, key))
        try:
            checks.append((state, Check(compile_rule(rule), key)))
        except Exception as exc:
            state.error = str(_("This rule cannot be used: %(e)s") % {"e": exc})
        states.append(state)
    if checks:
        try:
            results = get_store().decide([check for _, check in checks], dry_run=True)
        except STORE_ERRORS as exc:
            for state, _check in checks:
                state.error = str(_("The store is unavailable (%(e)s).") % {"e": exc})
        else:
            for (state, _check), result in zip(checks, results, strict=True):
                state.limit = result.limit
                state.remaining = result.remaining
                state.reset_at = _datetime(int(result.reset_at + 0.999))
                state.retry_after = result.retry_after
                state.allowed = result.allowed
    return states


def _usernames(rows: list[dict[str, Any]]) -> dict[str, str]:
    """``user:42`` -> the user's name, in one query for the page (never per request)."""
    pks = {row["display"][5:] for row in rows if row["display"].startswith("user:")}
    if not pks:
        return {}
    User = get_user_model()
    try:
        found = User.objects.filter(pk__in=pks).values_list("pk", User.USERNAME_FIELD)
        return {f"user:{pk}": str(name) for pk, name in found}
    except (ValueError, TypeError, ValidationError):
        return {}


# -- the admin action on rules ----------------------------------------------------------


@admin.action(description=_("Inspect or reset a client key under the selected rules"))
def inspect_key(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Rule]) -> HttpResponse:
    query = urlencode([("rule", pk) for pk in queryset.order_by("pk").values_list("pk", flat=True)])
    return HttpResponseRedirect(reverse("admin:django_throttle_dashboard_key") + "?" + query)
