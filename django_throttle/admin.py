"""Admin for rate-limit rules, overrides and bans."""

from __future__ import annotations

from datetime import timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers, widgets
from django.core.exceptions import ValidationError
from django.db.models import Model, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.translation import gettext, ngettext, pgettext
from django.utils.translation import gettext_lazy as _

from .admin_rulefiles import export_response, import_page
from .choices import ALGORITHMS_WITH_BURST, KEY_KINDS_WITH_ARG, AppliesTo
from .compiled import compile_rule, with_overrides
from .dashboard.fields import IdAutocompleteSelect, IdField, IdsField, usable_pk
from .dashboard.views import DashboardAdmin, collect_counts, inspect_key
from .models import Ban, Dashboard, Override, Rejection, Rule

if TYPE_CHECKING:
    # ModelAdmin is generic in django-stubs only; it cannot be subscripted at run time.
    _RuleModelAdmin = admin.ModelAdmin[Rule]
    _OverrideModelAdmin = admin.ModelAdmin[Override]
    _OverrideInline = admin.TabularInline[Override, Rule]
    _BanModelAdmin = admin.ModelAdmin[Ban]
else:
    _RuleModelAdmin = admin.ModelAdmin
    _BanModelAdmin = admin.ModelAdmin
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


def usable_selection(request: HttpRequest, model: type[Model]) -> None:
    """Leave out of an action's selection the ids the database cannot hold: Django's admin
    filters by them, and "abc" or a 65-bit number raise (a 500)."""
    selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
    usable = [pk for pk in selected if usable_pk(model, pk)]
    if usable != selected:
        post = request.POST.copy()
        post.setlist(helpers.ACTION_CHECKBOX_NAME, usable)
        request.POST = post  # type: ignore[assignment]


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


# A few lines (admin.css lifts the admin's 150 px minimum), not filter_horizontal's 350 px.
COMPACT_PICKER = MappingProxyType({"size": "4", "class": "throttle-compact"})


def shown_when(field: str, values: Any) -> dict[str, str]:
    """Widget attributes that rule_form.js reads: the row shows while ``field`` has one of
    ``values`` or the widget holds a value (so nothing set is ever out of sight)."""
    return {"data-throttle-when": f"{field}={','.join(sorted(str(v) for v in values))}"}


class RuleForm(forms.ModelForm):  # type: ignore[type-arg]
    """The rule form, compact: what only some rules use is small, or hidden until it matters."""

    class Meta:
        model = Rule
        fields = "__all__"
        field_classes = {"groups": IdsField, "exempt_groups": IdsField}
        widgets = {
            "key_arg": widgets.AdminTextInputWidget(
                attrs=shown_when("key_kind", KEY_KINDS_WITH_ARG)
            ),
            "burst": widgets.AdminIntegerFieldWidget(
                attrs=shown_when("algorithm", ALGORITHMS_WITH_BURST)
            ),
            "groups": forms.SelectMultiple(
                attrs={**COMPACT_PICKER, **shown_when("applies_to", {AppliesTo.GROUPS})}
            ),
            "exempt_groups": forms.SelectMultiple(attrs=dict(COMPACT_PICKER)),
            "exempt_networks": widgets.AdminTextareaWidget(attrs={"rows": 2}),
        }

    class Media:
        js = ("django_throttle/rule_form.js",)


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
    actions = ("enable_rules", "disable_rules", "export_rules", inspect_key)
    inlines = (OverrideInline,)
    form = RuleForm
    readonly_fields = ("in_words", "created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("name", "enabled", "in_words")}),
        (_("Matching"), {"fields": ("scope", "methods", "count_statuses", "cost_header")}),
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
        (_("Behaviour"), {"fields": ("block_seconds", "block_growth", "action", "fail_mode")}),
        (_("Timestamps"), {"fields": ("created_at", "updated_at"), "classes": ("collapse",)}),
    )
    # Folded while every field in them has its default (a new rule, or one that never set them).
    folded_at_defaults = (_("Behaviour"),)

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
        usable_selection(request, Rule)
        collect_counts()  # every process's counts waiting in Redis, before the list reads them
        extra = {"can_import_rules": self.has_change_permission(request), **(extra_context or {})}
        return super().changelist_view(request, extra)

    def get_urls(self) -> list[URLPattern]:
        # Before the model's own URLs, whose "<path:object_id>/" would take "import/".
        info = (self.opts.app_label, self.opts.model_name)
        view = self.admin_site.admin_view(self.import_view)
        return [path("import/", view, name="{}_{}_import".format(*info)), *super().get_urls()]

    def import_view(self, request: HttpRequest) -> HttpResponse:
        return import_page(self, request)

    def get_fieldsets(self, request: HttpRequest, obj: Rule | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        return [
            (name, {**options, "classes": (*options.get("classes", ()), "collapse")})
            if name in self.folded_at_defaults and _at_defaults(obj, options["fields"])
            else (name, options)
            for name, options in fieldsets
        ]

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
        kind = rule.get_key_kind_display()  # the choice's label, in the active language
        if not rule.key_arg:
            return str(kind)
        return pgettext("a key kind and its argument", "%(kind)s: %(arg)s") % {
            "kind": kind,
            "arg": rule.key_arg,
        }

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

    @admin.action(description=_("Export selected rules"), permissions=["view"])
    def export_rules(self, request: HttpRequest, queryset: QuerySet[Rule]) -> HttpResponse:
        return export_response(queryset)


def _at_defaults(rule: Rule | None, names: Any) -> bool:
    """Whether each of these fields of ``rule`` holds its default (a new rule: yes)."""
    if rule is None:
        return True
    for name in names:
        field = Rule._meta.get_field(name)
        if not hasattr(field, "get_default") or getattr(rule, name) != field.get_default():
            return False
    return True


@admin.register(Override)
class OverrideAdmin(_OverrideModelAdmin):
    list_display = ("key", "rule", "limit", "exempt", "expires_at", "in_force")
    list_filter = ("exempt", "rule")
    search_fields = ("key", "rule__name")
    autocomplete_fields = ("rule",)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "rule":
            kwargs.setdefault("widget", IdAutocompleteSelect(db_field, self.admin_site))
            kwargs.setdefault("form_class", IdField)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        usable_selection(request, Override)
        return super().changelist_view(request, extra_context)

    @admin.display(description=_("in force"))
    def in_force(self, override: Override) -> str:
        return override_in_force(override)


class BanStateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Any:
        return (("active", _("in force")), ("expired", _("expired")))

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        now = timezone.now()
        if self.value() == "active":
            return queryset.exclude(expires_at__lte=now)
        if self.value() == "expired":
            return queryset.filter(expires_at__lte=now)
        return queryset


@admin.register(Ban)
class BanAdmin(_BanModelAdmin):
    list_display = ("key", "reason", "expires_at", "created_at", "in_force")
    list_filter = (BanStateFilter,)
    search_fields = ("key", "reason")
    fields = ("key", "reason", "expires_at", "created_at")
    readonly_fields = ("created_at",)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        usable_selection(request, Ban)
        return super().changelist_view(request, extra_context)

    @admin.display(description=_("in force"), boolean=True)
    def in_force(self, ban: Ban) -> bool:
        return ban.in_force()


admin.site.register(Dashboard, DashboardAdmin)
