"""The admin dashboard's pages: rejections by rule and client, and a key's state; the actions
on a client (actions.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin
from django.contrib.auth import get_permission_codename, get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..choices import ALGORITHMS_WITH_BURST as BUCKETS
from ..choices import Action, Algorithm, KeyKind
from ..compiled import MAX_LIMIT, CompiledRule, with_overrides
from ..conf import conf
from ..engine import block_levels, inspect, rule_for
from ..models import Ban, Dashboard, Override, Rule
from ..rates import UNIT_SECONDS, describe
from ..rejection_log import REJECT, SHADOW, UNAVAILABLE, collect, is_complete
from ..rejection_log.database import as_datetime, read_sizes
from ..rejection_log.sizing import Sizing, sizing
from ..rules import compile_rule, default_scopes, defaults_of
from ..store import Result, get_store
from ..store.errors import STORE_ERRORS
from .actions import BAN, BLOCK_TIMES, EXPIRY_TIMES, act, ban, may, may_override
from .chart import chart_svg, legend
from .fields import IdsField, RuleNameSearch, RuleSearch
from .queries import DEFAULT_PERIOD, PERIODS, dashboard_data

logger = logging.getLogger("django_throttle")
COLLECT_WAIT = 1.0  # seconds the page waits for this process's own flush under way

if TYPE_CHECKING:
    # ModelAdmin is generic in django-stubs only; it cannot be subscripted at run time.
    _DashboardModelAdmin = admin.ModelAdmin[Dashboard]
else:
    _DashboardModelAdmin = admin.ModelAdmin

# -- forms --------------------------------------------------------------------------------


RULES_PER_PAGE = 20  # a page of the pickers' search, as the admin's autocomplete pages
MAX_RULES_PAGE = 100_000  # past any table's end; an offset the database can always bind


def _rule_field() -> Any:
    # The pickers' widgets take a relation to Rule; the override's is one that always exists.
    return Override._meta.get_field("rule")


class FilterForm(forms.Form):
    """The dashboard's filter: one rule by name (a search) or all."""

    rule = forms.CharField(
        label=_("Rule"),
        required=False,
        widget=RuleNameSearch(_rule_field(), admin.site),
    )


class SizingForm(forms.Form):
    """A limit typed in, to see what it would have rejected of the chosen rule's traffic."""

    limit = forms.IntegerField(
        label=_("Limit"),
        required=False,
        min_value=1,
        max_value=MAX_LIMIT,
        widget=forms.NumberInput(attrs={"size": 8}),
    )


@dataclass
class SizingView:
    """The sizing of one rule's limit, as the dashboard shows it."""

    form: SizingForm
    figures: Sizing | None = None
    unavailable: str = ""

    def as_json(self, rule: str) -> dict[str, Any] | None:
        return None if self.figures is None else self.figures.as_json(rule)


def _rule_limit(name: str) -> tuple[int, int, str, bool] | None:
    """The limit, period and algorithm of the rule of this name (a row, or a scope's code
    default, which enforces), and whether it only logs."""
    row = (
        Rule.objects.filter(name=name)
        .values_list("limit", "per", "unit", "algorithm", "action")
        .first()
    )
    if row is not None:
        return row[0], row[1] * UNIT_SECONDS[row[2]], row[3], row[4] == Action.LOG
    defaults = defaults_of(name)
    if len(defaults) != 1:
        return None
    rate = defaults[0].rate
    return rate.limit, rate.per * UNIT_SECONDS[rate.unit], defaults[0].algorithm, False


def size(request: HttpRequest, rule: str | None, data: Mapping[str, Any]) -> SizingView:
    """The chosen rule's sizing over the dashboard's period, for the ``limit`` typed in."""
    form = SizingForm(request.GET if request.GET.get("limit") else None)
    view = SizingView(form)
    if not rule:
        return view
    found = _rule_limit(rule)
    if found is None:
        return view
    rule_limit, period, algorithm, log_only = found
    if algorithm != Algorithm.FIXED_WINDOW:
        view.unavailable = gettext(
            "Sizing is not available for this rule: only a fixed window counts each client's "
            "requests per window."
        )
        return view
    typed = form.cleaned_data["limit"] if form.is_bound and form.is_valid() else None
    if typed is not None and typed >= rule_limit and not log_only:
        form.add_error(
            "limit",
            gettext(
                "Past the rule's own limit (%(limit)s) its traffic is not known: type a lower "
                "limit."
            )
            % {"limit": rule_limit},
        )
        typed = None
    sums = read_sizes(rule, data["start"], data["end"], period)
    view.figures = sizing(sums, rule_limit, typed, log_only)
    return view


class KeyForm(forms.Form):
    rule = IdsField(
        queryset=Rule.objects.all(),
        label=_("Rules"),
        required=False,
        widget=RuleSearch(_rule_field(), admin.site),
    )
    scope = forms.ChoiceField(
        label=_("Code defaults of the scope"),
        required=False,
        help_text=_("The @throttle(rate=...) defaults of a scope, in force while it has no rule."),
    )
    key = forms.CharField(
        label=_("Client key"),
        max_length=2000,
        strip=True,
        help_text=_("As the dashboard shows it: ip:203.0.113.7, user:42, header:VALUE, global."),
        widget=forms.TextInput(attrs={"size": 40, "placeholder": "ip:203.0.113.7"}),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        scopes = default_scopes()
        self.fields["scope"].choices = [("", "---------")] + [(s, s) for s in scopes]  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not data.get("rule") and not data.get("scope"):
            raise forms.ValidationError(_("Choose rules, or a scope with code defaults."))
        return data


KEY_PREFIXES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        KeyKind.IP: ("ip:",),
        KeyKind.USER: ("user:",),
        KeyKind.USER_OR_IP: ("user:", "ip:"),
        KeyKind.HEADER: ("header:",),
        KeyKind.PARAM: ("param:",),
        KeyKind.CUSTOM: ("custom:",),
    }
)


def key_mismatch(rule: Rule, key: str) -> str | None:
    """Why this key cannot be one the rule counts, or None."""
    if rule.key_kind == KeyKind.GLOBAL:
        return None if key == "global" else str(_("This rule has one key for everyone: global."))
    prefixes = KEY_PREFIXES.get(rule.key_kind, ())
    if prefixes and not key.startswith(prefixes):
        return str(_("This rule counts keys written %(p)s...")) % {"p": " or ".join(prefixes)}
    return None


# -- the admin ------------------------------------------------------------------------------


class DashboardAdmin(_DashboardModelAdmin):
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
            path(
                "rules/",
                self.admin_site.admin_view(self.rules_view),
                name="{}_{}_rules".format(*info),
            ),
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
        collect_counts()
        data = dashboard_data(rule, period, store_now())
        sized = size(request, rule, data)
        data["sizing"] = sized.as_json(rule) if rule else None
        # The rules the rows name, not the table: the page's size and time do not grow with it.
        named = {row["rule"] for row in [*data["top_keys"], *data["recent"]]}
        rule_ids = dict(Rule.objects.filter(name__in=named).values_list("name", "pk"))
        usernames = _usernames([*data["top_keys"], *data["recent"]])
        for row in [*data["top_keys"], *data["recent"]]:
            row["client"] = row["display"]
            if row["display"] in usernames:
                row["client"] = f"{row['display']} ({usernames[row['display']]})"
            _target(row, rule_ids)
        _offer_overrides(request, data["top_keys"])
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
        filter_form = FilterForm(initial={"rule": rule}, auto_id="id_filter_%s")
        key_form = KeyForm()
        context = self._context(
            request,
            _("Rate-limiting dashboard"),
            data=data,
            chart=chart_svg(data, PERIODS[period].tick_format),
            legend=legend(data),
            rule=rule,
            filter_form=filter_form,
            media=filter_form.media + key_form.media,
            period=period,
            period_label=PERIODS[period].label,
            periods=periods,
            bucket_minutes=PERIODS[period].bucket // 60,
            data_url=reverse("admin:django_throttle_dashboard_data")
            + "?"
            + urlencode(
                {
                    k: v
                    for k, v in (
                        ("rule", rule),
                        ("period", period),
                        ("limit", sized.figures and sized.figures.limit),
                    )
                    if v
                }
            ),
            key_form=key_form,
            sizing=sized,
            can_act=self.can_reset(request),
            **_actions(request),
            flush_interval=conf.FLUSH_INTERVAL,
            retention_days=conf.RETENTION_DAYS,
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/django_throttle/dashboard.html", context)

    def data_view(self, request: HttpRequest) -> JsonResponse:
        self._require_view(request)
        rule, period = self._filters(request)
        collect_counts()
        data = dashboard_data(rule, period, store_now())
        sized = size(request, rule, data)
        if sized.form.errors:
            return JsonResponse({"errors": sized.form.errors}, status=400)
        data["sizing"] = sized.as_json(rule) if rule else None
        return JsonResponse(data, encoder=DjangoJSONEncoder)

    def key_view(self, request: HttpRequest) -> HttpResponse:
        """GET: the state of a key under some rules, read without consuming. POST: reset it."""
        self._require_view(request)
        if request.method == "POST":
            if request.POST.get("action") == BAN:
                return ban(request)  # which checks the Ban add permission
            if not self.can_reset(request):
                raise PermissionDenied
            return act(request)
        form = KeyForm(request.GET if "key" in request.GET else None, initial=_initial(request))
        states = []
        if form.is_bound and form.is_valid():
            states = _states(list(form.cleaned_data["rule"]), form.cleaned_data["key"])
            _offer_overrides_on(request, states, form.cleaned_data["key"])
            states += _default_states(form.cleaned_data["scope"], form.cleaned_data["key"])
        context = self._context(
            request,
            _("Inspect a client key"),
            form=form,
            media=form.media,
            key=form.cleaned_data["key"] if form.is_bound and form.is_valid() else "",
            states=states,
            can_reset=self.can_reset(request),
            **_actions(request),
        )
        return TemplateResponse(request, "admin/django_throttle/dashboard_key.html", context)

    def rules_view(self, request: HttpRequest) -> JsonResponse:
        """The rules whose name or scope holds ``term`` (the Rule admin's search_fields), a
        page at a time, in select2's format, for the pages' pickers: ids as values, or names
        with ``by=name`` (then a scope's code defaults too). It asks what the pages ask (the
        dashboard's view permission), not the Rule admin's."""
        self._require_view(request)
        term = request.GET.get("term", "")
        try:
            page = min(max(int(request.GET.get("page") or 1), 1), MAX_RULES_PAGE)
        except ValueError:
            page = 1
        by_name = request.GET.get("by") == "name"
        rules, _distinct = self.admin_site.get_model_admin(Rule).get_search_results(
            request, Rule.objects.order_by("name", "pk"), term
        )
        start = (page - 1) * RULES_PER_PAGE
        found = list(rules[start : start + RULES_PER_PAGE + 1])  # one more: is there a next?
        results = [
            {
                "id": rule.name if by_name else str(rule.pk),
                "text": rule.name if by_name else str(rule),
            }
            for rule in found[:RULES_PER_PAGE]
        ]
        if by_name and page == 1:
            names = {result["id"] for result in results}
            results += [
                {"id": scope, "text": gettext("%(scope)s (code default)") % {"scope": scope}}
                for scope in default_scopes()
                if term.casefold() in scope.casefold() and scope not in names
            ]
        more = len(found) > RULES_PER_PAGE
        return JsonResponse({"results": results, "pagination": {"more": more}})


def _target(row: dict[str, Any], rule_ids: Mapping[str, int]) -> None:
    """What a row of the top clients or recent rejections can be acted on under: its admin
    rule (``rule_pk``), else the code defaults of the scope the rule is named after
    (``scope``: a code default is named after its scope), and its key page's URL; neither
    for a key not kept whole."""
    row["rule_pk"], row["scope"], row["inspect_url"] = None, "", None
    if not is_complete(row["display"], row["key"]):
        return
    rule_id = rule_ids.get(row["rule"])
    if rule_id is not None:
        row["rule_pk"], where = rule_id, {"rule": rule_id}
    elif defaults_of(row["rule"]):
        row["scope"], where = row["rule"], {"scope": row["rule"]}
    else:
        return  # a rule deleted since
    query = urlencode({**where, "key": row["display"]})
    row["inspect_url"] = reverse("admin:django_throttle_dashboard_key") + "?" + query


def _offer_overrides(request: HttpRequest, rows: list[dict[str, Any]]) -> None:
    """``can_override`` on each row: whether the user may exempt its client or give it its
    own limit, which makes (add) or replaces (change) its override; one query for the page."""
    wanted = {(row["rule_pk"], Override.keyed(row["display"])) for row in rows if row["rule_pk"]}
    existing: set[tuple[int, str]] = set()
    if wanted:
        pairs = Override.objects.filter(
            rule_id__in={pk for pk, _ in wanted}, key__in={key for _, key in wanted}
        ).values_list("rule_id", "key")
        existing = set(pairs) & wanted
    for row in rows:
        exists = (row["rule_pk"], Override.keyed(row["display"])) in existing
        row["can_override"] = bool(row["rule_pk"]) and may_override(request, exists)


def _offer_overrides_on(request: HttpRequest, states: list[KeyState], key: str) -> None:
    """``can_override`` on each rule's state of the key page, as for the dashboard's rows."""
    rules = [state.rule.pk for state in states if state.rule.pk is not None]
    existing = set(
        Override.objects.filter(rule_id__in=rules, key=Override.keyed(key)).values_list(
            "rule_id", flat=True
        )
    )
    for state in states:
        if state.rule.pk is not None:
            state.can_override = may_override(request, state.rule.pk in existing)


def store_now() -> datetime | None:
    """The store's clock (Redis TIME), which files the rejections: the page's last hour is
    the store's; None (this host's clock) without Redis or when it cannot be read."""
    if not conf.uses_redis:
        return None
    try:
        seconds = get_store().server_time()
    except Exception:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc)


def collect_counts() -> None:
    """Write the counts every process handed to Redis, so the page shows the last second."""
    try:
        collect(timeout=COLLECT_WAIT)
    except Exception:  # the page shows what the database has
        logger.exception("django_throttle: the dashboard could not collect rejection counts")


ACTION_LABELS = MappingProxyType(
    {
        REJECT: _("rejected (429)"),
        UNAVAILABLE: _("failed closed (503)"),
        SHADOW: _("shadow"),
    }
)


def _initial(request: HttpRequest) -> dict[str, Any]:
    return {"rule": request.GET.getlist("rule"), "scope": request.GET.get("scope", "")}


@dataclass(frozen=True)
class CodeDefault:
    """A code default shown like a rule on the key page (it has no row)."""

    name: str
    scope: str
    rate_description: str
    pk: None = None


@dataclass
class KeyState:
    rule: Rule | CodeDefault
    limit: int | None = None
    remaining: int | None = None
    reset_at: datetime | None = None
    retry_after: float | None = None
    allowed: bool | None = None
    blocked: bool = False
    block_level: int = 0  # blocks a growing rule has given the client while remembered
    error: str | None = None
    warning: str | None = None
    can_override: bool = False  # the user may exempt the client or give it its own limit

    def show(self, rule: CompiledRule, result: Result) -> None:
        """What the store says of the client under ``rule`` (as applied to it)."""
        # A bucket holds up to its burst: "5 / 10" for a full bucket of 5 was wrong.
        self.limit = rule.burst if rule.algorithm in BUCKETS else result.limit
        self.remaining = result.remaining
        self.reset_at = as_datetime(int(result.reset_at + 0.999))
        self.retry_after = result.retry_after
        self.allowed = result.allowed
        self.blocked = result.blocked


def _actions(request: HttpRequest) -> dict[str, Any]:
    """What the pages' actions on a client (dashboard_actions.html) need."""
    return {
        "can_ban": may(request, "add", Ban),
        "here": request.get_full_path(),
        "block_times": BLOCK_TIMES,
        "expiry_times": EXPIRY_TIMES,
    }


def _states(rules: list[Rule], key: str) -> list[KeyState]:
    """Each rule's state for this key, in one store call that consumes nothing."""
    states, checks = [], []
    for rule in rules:
        state = KeyState(rule, warning=key_mismatch(rule, key))
        states.append(state)
        try:
            compiled = compile_rule(rule)
        except Exception as exc:
            state.error = str(_("This rule cannot be used: %(e)s") % {"e": exc})
            continue
        # As the engine applies it to this client: its override, if it has one.
        overrides = [(o.key, o.limit, o.exempt) for o in rule.overrides.filter(key=key)]
        own = rule_for(with_overrides(compiled, overrides)[0], key)
        if own is None:
            state.error = str(_("This client is exempt from the rule (an override)."))
            continue
        checks.append((state, own))
    if checks:
        owns = [own for _, own in checks]
        try:
            results = inspect(owns, key)
            levels = block_levels(owns, key)
        except STORE_ERRORS as exc:
            for state, _own in checks:
                state.error = str(_("The store is unavailable (%(e)s).") % {"e": exc})
        else:
            for (state, own), result, level in zip(checks, results, levels, strict=True):
                state.show(own, result)
                state.block_level = level
    return states


def _default_states(scope: str, key: str) -> list[KeyState]:
    """The key's state under the code defaults of a scope, in one store call."""
    defaults = defaults_of(scope) if scope else []
    if not defaults:
        return []
    compiled = [default.compile() for default in defaults]
    states = [
        KeyState(
            CodeDefault(
                name=gettext("%(scope)s (code default)") % {"scope": scope},
                scope=scope,
                rate_description=describe(d.rate.limit, d.rate.per, d.rate.unit),
            )
        )
        for d in defaults
    ]
    try:
        results = inspect(compiled, key)
    except STORE_ERRORS as exc:
        for state in states:
            state.error = str(_("The store is unavailable (%(e)s).") % {"e": exc})
        return states
    for state, rule, result in zip(states, compiled, results, strict=True):
        state.show(rule, result)
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
