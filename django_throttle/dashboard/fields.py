"""Form fields and widgets that take ids from a request: an id the database cannot hold is a
form error, never a query (SQLite cannot bind an integer beyond 64 bits: OverflowError)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.admin.widgets import AutocompleteSelect, AutocompleteSelectMultiple
from django.core.exceptions import ValidationError
from django.db import connections, models, router
from django.urls import reverse
from django.utils.translation import gettext


def usable_pk(model: type[models.Model], value: object) -> bool:
    """Whether ``value`` can be one of the model's primary keys in its database."""
    field = model._meta.pk
    assert field is not None
    ops = connections[router.db_for_read(model)].ops
    try:
        low, high = ops.integer_field_range(field.get_internal_type())
    except KeyError:
        return True  # not an integer key: its own field's validation is enough
    try:
        number = int(str(value))
    except ValueError:
        return False
    return (low is None or number >= low) and (high is None or number <= high)


class IdsField(forms.ModelMultipleChoiceField):  # type: ignore[type-arg]
    """ModelMultipleChoiceField whose ids are checked against the key's range first."""

    def clean(self, value: Any) -> Any:
        if isinstance(value, (list, tuple)) and self.to_field_name is None:
            for pk in value:
                if not usable_pk(_model(self), pk):
                    raise ValidationError(
                        self.error_messages["invalid_pk_value"],
                        code="invalid_pk_value",
                        params={"pk": pk},
                    )
        return super().clean(value)


class IdField(forms.ModelChoiceField):  # type: ignore[type-arg]
    """ModelChoiceField whose id is checked against the key's range first."""

    def to_python(self, value: Any) -> Any:
        if (
            value not in self.empty_values
            and self.to_field_name is None
            and not isinstance(value, models.Model)
            and not usable_pk(_model(self), value)
        ):
            raise ValidationError(
                self.error_messages["invalid_choice"],
                code="invalid_choice",
                params={"value": value},
            )
        return super().to_python(value)


def _model(field: forms.ModelChoiceField) -> type[models.Model]:  # type: ignore[type-arg]
    assert field.queryset is not None
    return field.queryset.model


class IdAutocompleteSelect(AutocompleteSelect):
    """The admin's autocomplete widget, which looks up the value it shows again: a form sent
    back with an id that cannot be one shows no choice instead of failing (Django filters by
    it, and "abc" or a 65-bit number raise)."""

    def optgroups(self, name: str, value: Any, attr: Any = None) -> Any:
        model = self.field.remote_field.model
        return super().optgroups(name, [v for v in value if v and usable_pk(model, v)], attr)


# -- rules picked by a search: pages that do not grow with the rule table -----------------------

RULES_URL = "%s:django_throttle_dashboard_rules"


class RuleSearch(AutocompleteSelectMultiple):
    """Rules picked by a search of their name or scope (the admin's select2, vendored in
    Django, served from the dashboard's own list of rules, which asks only the dashboard's
    permission): the page holds the chosen rules only, never the whole table."""

    def get_url(self) -> str:
        return reverse(RULES_URL % self.admin_site.name)

    def optgroups(self, name: str, value: Any, attr: Any = None) -> Any:
        model = self.field.remote_field.model
        return super().optgroups(name, [v for v in value if v and usable_pk(model, v)], attr)


class RuleNameSearch(AutocompleteSelect):
    """One rule by its name (the dashboard's filter, which also takes names the table no
    longer has, or a scope's code defaults), picked by a search: the page holds the chosen
    name only."""

    def get_url(self) -> str:
        return reverse(RULES_URL % self.admin_site.name) + "?by=name"

    def build_attrs(self, base_attrs: Any, extra_attrs: Any = None) -> Any:
        attrs = super().build_attrs(base_attrs, extra_attrs)
        attrs["data-placeholder"] = gettext("All rules")
        return attrs

    def optgroups(self, name: str, value: Any, attr: Any = None) -> Any:
        chosen = [str(v) for v in value if v]
        options = [self.create_option(name, "", "", not chosen, 0)]
        options += [self.create_option(name, v, v, True, i) for i, v in enumerate(chosen, 1)]
        return [(None, options, 0)]
