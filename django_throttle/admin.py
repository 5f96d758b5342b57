"""Admin for rate-limit rules."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from .compiled import compile_rule, with_overrides
from .dashboard.views import DashboardAdmin, collect_counts, inspect_key
from .models import Dashboard, Override, Rejection, Rule

if TYPE_CHECKING:
    # ModelAdmin is generic in django-stubs only; it cannot be subscripted at run time.
    _RuleModelAdmin = admin.ModelAdmin[Rule]
    _OverrideModelAdmin = admin.ModelAdmin[Override]
    _OverrideInline = admin.TabularInline[Override, Rule]
else:
    _RuleModelAdmin = admin.ModelAdmin
    _OverrideModelAdmin = admin.ModelAdmin
    _OverrideInline = admin.TabularInline


class OverrideFormSet(BaseInlineFormSet):  # type: ignore[type-arg]
    def clean(self) -> None:
        """Two rows whose keys are one client (ip:2001:db8::1 and ::2 share their /64) are an
        error on the form, not a 500 when the second is saved."""
        super().clean()
        seen: set[str] = set()
        for form in self.forms:
            data = getattr(form, "cleaned_data", None) or {}
            if not data or data.get("DELETE") or not data.get("key"):
                continue
            key = Override.keyed(data["key"])
            if key in seen:
                raise ValidationError(_("Two overrides are for the client %(key)s.") % {"key": key})
            seen.add(key)


def override_in_force(override: Override) -> str:
    """ "expired" for an override past its expires_at (ignored by every process), else "yes"."""
    if override.pk is None:
        return "-"
    if override.expires_at is not None and override.expires_at <= timezone.now():
        return str(_("expired"))
    return str(_("yes"))


class OverrideInline(_OverrideInline):
    model = Override
    formset = OverrideFormSet
    extra = 0
    fields = ("key", "limit", "exempt", "expires_at", "in_force")
    readonly_fields = ("in_force",)

    @admin.display(description=_("in force"))
    def in_force(self, override: Override) -> str:
        return override_in_force(override)


@admin.register(Rule)
class RuleAdmin(_RuleModelAdmin):
    list_display = (
        "name",
        "scope",
        "methods_shown",
        "rate",
        "key",
        "algorithm",
        "action",
        "enabled",
        "state",
        "rejected_last_hour",
        "in_words",
    )
    list_display_links = ("name",)
    list_filter = ("algorithm", "key_kind", "enabled", "action")
    search_fields = ("name", "scope")
    actions = ("enable_rules", "disable_rules", inspect_key)
    inlines = (OverrideInline,)
    filter_horizontal = ("groups", "exempt_groups")
    readonly_fields = ("in_words", "created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("name", "enabled", "in_words")}),
        (_("Matching"), {"fields": ("scope", "methods", "count_statuses")}),
        (
            _("Who it applies to"),
            {
                "fields": (
                    "applies_to",
                    "groups",
                    "exempt_staff",
                    "exempt_groups",
                    "exempt_networks",
                )
            },
        ),
        (
            _("Limit"),
            {"fields": ("key_kind", "key_arg", "limit", "per", "unit", "algorithm", "burst")},
        ),
        (_("Behaviour"), {"fields": ("block_seconds", "action", "fail_mode")}),
        (_("Timestamps"), {"fields": ("created_at", "updated_at"), "classes": ("collapse",)}),
    )

    class Media:
        css = {"all": ("django_throttle/admin.css",)}

    @admin.display(description=_("rate"), ordering="limit")
    def rate(self, rule: Rule) -> str:
        text = rule.rate_description
        if not rule.burst:
            return text
        return gettext("%(rate)s (burst %(burst)s)") % {"rate": text, "burst": rule.burst}

    @admin.display(description=_("in words"))
    def in_words(self, rule: Rule) -> str:
        return rule.explanation if rule.pk or rule.limit else "-"

    @admin.display(description=_("methods"), ordering="methods")
    def methods_shown(self, rule: Rule) -> str:
        return rule.methods.replace(",", ", ") if rule.methods else str(_("all"))

    @admin.display(description=_("rejected, last hour"), ordering="rejected_recently")
    def rejected_last_hour(self, rule: Rule) -> int:
        return int(getattr(rule, "rejected_recently", 0))

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        collect_counts()  # every process's counts waiting in Redis, before the list reads them
        return super().changelist_view(request, extra_context)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Rule]:
        # The last hour's rejections in the page's one query, not one query per row.
        since = timezone.now() - timedelta(hours=1)
        recent = (
            Rejection.objects.filter(rule=OuterRef("name"), minute__gte=since)
            .values("rule")
            .annotate(n=Sum("count"))
            .values("n")
        )
        return (
            super().get_queryset(request).annotate(rejected_recently=Coalesce(Subquery(recent), 0))
        )

    @admin.display(description=_("in force"))
    def state(self, rule: Rule) -> str:
        """Whether the rule is enforced; a row that cannot be compiled (written around the
        admin's validation) is skipped by every process, and says why here."""
        if not rule.enabled:
            return "-"
        try:
            compiled = compile_rule(rule)
        except Exception as exc:  # what load_rules skips the rule for
            return str(_("broken: %(reason)s") % {"reason": exc})
        overrides = [(o.key, o.limit, o.exempt) for o in rule.overrides.all()]
        skipped = with_overrides(compiled, overrides)[1]
        if skipped:
            return str(_("yes; overrides skipped: %(what)s") % {"what": "; ".join(skipped)})
        if rule.applies_to == "groups" and not rule.groups.exists():
            return str(_("yes, but no group is chosen: it counts nobody"))
        return str(_("yes"))

    @admin.display(description=_("key"), ordering="key_kind")
    def key(self, rule: Rule) -> str:
        return f"{rule.key_kind}:{rule.key_arg}" if rule.key_arg else rule.key_kind

    def _set_enabled(self, request: HttpRequest, queryset: QuerySet[Rule], enabled: bool) -> None:
        # RuleQuerySet.update announces the change, although update() sends no signals.
        try:
            count = queryset.update(enabled=enabled)
        except ValidationError as exc:  # enabling a rule that is broken
            self.message_user(request, "; ".join(exc.messages), messages.ERROR)
            return
        message = (
            ngettext("%(n)d rule enabled.", "%(n)d rules enabled.", count)
            if enabled
            else ngettext("%(n)d rule disabled.", "%(n)d rules disabled.", count)
        )
        self.message_user(request, message % {"n": count}, messages.SUCCESS)

    @admin.action(description=_("Enable selected rules"), permissions=["change"])
    def enable_rules(self, request: HttpRequest, queryset: QuerySet[Rule]) -> None:
        self._set_enabled(request, queryset, True)

    @admin.action(description=_("Disable selected rules"), permissions=["change"])
    def disable_rules(self, request: HttpRequest, queryset: QuerySet[Rule]) -> None:
        self._set_enabled(request, queryset, False)


@admin.register(Override)
class OverrideAdmin(_OverrideModelAdmin):
    list_display = ("key", "rule", "limit", "exempt", "expires_at", "in_force")
    list_filter = ("exempt", "rule")
    search_fields = ("key", "rule__name")
    autocomplete_fields = ("rule",)

    @admin.display(description=_("in force"))
    def in_force(self, override: Override) -> str:
        return override_in_force(override)


admin.site.register(Dashboard, DashboardAdmin)
