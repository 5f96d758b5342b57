"""The dashboard's actions on one client under one rule (or a scope's code defaults): Block,
Unblock, Exempt and Own limit; and Ban, everywhere. Each logged in the admin log."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth import get_permission_codename
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Model
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext_lazy as _

from ..compiled import MAX_LIMIT, CompiledRule
from ..engine import block_rules, reset_rules
from ..models import Ban, Dashboard, Override, Rule
from ..rules import compile_rule, defaults_of
from ..store.errors import STORE_ERRORS
from .fields import IdField

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser

BLOCK, UNBLOCK, EXEMPT, LIMIT, BAN = "block", "unblock", "exempt", "limit", "ban"
BLOCK_TIMES = (
    (900, _("15 minutes")),
    (3600, _("1 hour")),
    (86400, _("1 day")),
    (604800, _("1 week")),
)
EXPIRY_TIMES = (
    ("", _("never")),
    (3600, _("in 1 hour")),
    (86400, _("in 1 day")),
    (604800, _("in 1 week")),
    (2592000, _("in 30 days")),
)


class ActionForm(forms.Form):
    """One action's POST; without ``action``, Unblock (the key page's reset)."""

    action = forms.ChoiceField(
        choices=((UNBLOCK, UNBLOCK), (BLOCK, BLOCK), (EXEMPT, EXEMPT), (LIMIT, LIMIT)),
        required=False,
    )
    rule = IdField(queryset=Rule.objects.all(), required=False)
    scope = forms.CharField(max_length=255, required=False)
    key = forms.CharField(max_length=2000, strip=True)
    seconds = forms.TypedChoiceField(
        label=_("for"), choices=BLOCK_TIMES, coerce=int, required=False, empty_value=None
    )
    limit = forms.IntegerField(label=_("limit"), min_value=1, max_value=MAX_LIMIT, required=False)
    expires = forms.TypedChoiceField(
        label=_("ends"), choices=EXPIRY_TIMES, coerce=int, required=False, empty_value=None
    )
    next = forms.CharField(max_length=4000, required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        action = data["action"] = data.get("action") or UNBLOCK
        if not data.get("rule") and not data.get("scope"):
            raise forms.ValidationError(_("Choose a rule and a key to reset."))
        if action == BLOCK and not data.get("seconds"):
            raise forms.ValidationError(_("Choose how long to block the client for."))
        if action == LIMIT and data.get("limit") is None:
            raise forms.ValidationError(_("Give the client's own limit."))
        if action in (EXEMPT, LIMIT) and data.get("rule") is None:
            raise forms.ValidationError(
                _("Code defaults have no overrides: write a rule for the scope in the admin.")
            )
        return data


class BanForm(forms.Form):
    """Ban's POST: the client everywhere, not under a rule."""

    key = forms.CharField(max_length=255, strip=True)
    reason = forms.CharField(max_length=2000, required=False, strip=True)
    expires = forms.TypedChoiceField(
        label=_("ends"), choices=EXPIRY_TIMES, coerce=int, required=False, empty_value=None
    )
    next = forms.CharField(max_length=4000, required=False)


def may(request: HttpRequest, action: str, model: type[Model]) -> bool:
    """Whether the user holds the admin's permission ``action`` (add, change, delete, view)
    on ``model``: what the model's own admin pages ask of him."""
    opts = model._meta
    return request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")


def may_override(request: HttpRequest, exists: bool) -> bool:
    """Whether the user may make the client's override (add) or replace the one it has
    (change), as the Override admin and the rule's inline let him."""
    return may(request, "change" if exists else "add", Override)


def act(request: HttpRequest) -> HttpResponse:
    """Do what the POST asks (the caller has checked the permission to change rules; an
    override's own is checked here), say so, log it and go back where the form was."""
    form = ActionForm(request.POST)
    if not form.is_valid():
        errors = form.non_field_errors() or [_("Choose a rule and a key to reset.")]
        messages.error(request, " ".join(str(e) for e in errors))
        return HttpResponseRedirect(_back(request, form.data.get("next")))
    data = form.cleaned_data
    rule, scope, key, action = data["rule"], data["scope"], data["key"], data["action"]
    back = _back(request, data["next"], rule, scope, key)
    if action in (EXEMPT, LIMIT):
        return _override(request, rule, key, data, back)
    try:
        compiled = _compiled(rule, scope)
    except Exception as exc:  # a rule that cannot be compiled (e.g. a key function removed)
        messages.error(request, _("This rule cannot be used: %(e)s") % {"e": exc})
        return HttpResponseRedirect(back)
    if not compiled:
        messages.error(request, _("Choose a rule and a key to reset."))
        return HttpResponseRedirect(reverse("admin:django_throttle_dashboard_key"))
    try:
        if action == BLOCK:
            block_rules(compiled, key, data["seconds"])
        else:
            # Every process forgets remembered rejections (BLOCK_CACHE); no rule reloads.
            reset_rules(compiled, key)
    except STORE_ERRORS as exc:
        nothing = _("nothing was blocked") if action == BLOCK else _("nothing was reset")
        messages.error(
            request,
            _("The store is unavailable (%(e)s); %(nothing)s.") % {"e": exc, "nothing": nothing},
        )
        return HttpResponseRedirect(back)
    where = _where(rule, scope)
    if action == BLOCK:
        length = dict(BLOCK_TIMES)[data["seconds"]]
        _log(
            request,
            rule,
            scope,
            _("Blocked client key %(key)s for %(t)s.") % {"key": key, "t": length},
        )
        messages.success(
            request,
            _("Client key %(key)s blocked for %(t)s under %(where)s.")
            % {"key": key, "t": length, "where": where},
        )
    else:
        _log(request, rule, scope, _("Reset the state of client key %(key)s.") % {"key": key})
        if rule is not None:
            done = _("Client key %(key)s reset under rule %(rule)s.") % {
                "key": key,
                "rule": rule.name,
            }
        else:
            done = _("Client key %(key)s reset under the code defaults of %(scope)s.") % {
                "key": key,
                "scope": scope,
            }
        messages.success(request, done)
    return HttpResponseRedirect(back)


def ban(request: HttpRequest) -> HttpResponse:
    """Ban the client everywhere (its Ban, made, or changed if it has one), as the Ban admin
    lets the user: adding needs the add permission, changing the change permission. Every
    process refuses it once it reloads its rules, within RULES_REFRESH."""
    if not may(request, "add", Ban):
        raise PermissionDenied
    form = BanForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Choose a client key to ban."))
        return HttpResponseRedirect(_back(request, form.data.get("next")))
    data = form.cleaned_data
    key, seconds = data["key"], data["expires"]
    back = _back(request, data["next"])
    try:
        keyed = Ban.keyed(key)
    except ValueError as exc:
        messages.error(request, str(exc))
        return HttpResponseRedirect(back)
    existing = Ban.objects.filter(key=keyed).first()
    if existing is not None and not may(request, "change", Ban):
        raise PermissionDenied
    banned = existing or Ban(key=keyed)
    banned.expires_at = None if seconds is None else timezone.now() + timedelta(seconds=seconds)
    banned.reason = data["reason"] or banned.reason
    banned.save()
    if banned.expires_at is None:
        message = _("Banned client key %(key)s everywhere, with no end.") % {"key": banned.key}
    else:
        local = timezone.localtime(banned.expires_at)
        message = _("Banned client key %(key)s everywhere until %(t)s") % {
            "key": banned.key,
            "t": date_format(local, "DATETIME_FORMAT"),
        }
        message = f"{message}" if str(message).endswith(".") else f"{message}."
    LogEntry.objects.log_actions(
        user_id=_user_id(request),
        queryset=[banned],
        action_flag=ADDITION if existing is None else CHANGE,
        change_message=str(message),
        single_object=True,
    )
    messages.success(request, message)
    return HttpResponseRedirect(back)


def _compiled(rule: Rule | None, scope: str) -> list[CompiledRule]:
    if rule is not None:
        return [compile_rule(rule)]
    return [default.compile() for default in defaults_of(scope)]


def _override(
    request: HttpRequest, rule: Rule, key: str, data: dict[str, Any], back: str
) -> HttpResponse:
    """Exempt the client from the rule, or give it its own limit: its Override, made or
    changed (every process applies it once it reloads its rules, within RULES_REFRESH)."""
    exempt = data["action"] == EXEMPT
    seconds = data["expires"]
    expires_at = None if seconds is None else timezone.now() + timedelta(seconds=seconds)
    override = Override.objects.filter(rule=rule, key=Override.keyed(key)).first()
    created = override is None
    if not may_override(request, exists=not created):
        raise PermissionDenied
    if override is None:
        override = Override(rule=rule, key=key)
    override.exempt = exempt
    override.limit = None if exempt else data["limit"]
    override.expires_at = expires_at
    try:
        override.save()  # full_clean(): the key's form, as the Override admin checks it
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return HttpResponseRedirect(back)
    if exempt:
        what = _("Exempted client key %(key)s from rule %(rule)s") % {
            "key": override.key,
            "rule": rule.name,
        }
    else:
        what = _("Gave client key %(key)s its own limit of %(n)s under rule %(rule)s") % {
            "key": override.key,
            "n": override.limit,
            "rule": rule.name,
        }
    until = ""
    if expires_at is not None:
        local = timezone.localtime(expires_at) if timezone.is_aware(expires_at) else expires_at
        until = str(_(" until %(t)s") % {"t": date_format(local, "DATETIME_FORMAT")})
    # A date format may end in a full stop of its own ("6:30 a.m."): one is enough.
    message = f"{what}{until}" if until.endswith(".") else f"{what}{until}."
    LogEntry.objects.log_actions(
        user_id=_user_id(request),
        queryset=[override],
        action_flag=ADDITION if created else CHANGE,
        change_message=message,
        single_object=True,
    )
    messages.success(request, message)
    return HttpResponseRedirect(back)


def _log(request: HttpRequest, rule: Rule | None, scope: str, message: Any) -> None:
    """The admin log's entry: on the rule, or on the dashboard for a scope's code defaults
    (which have no row)."""
    if rule is not None:
        LogEntry.objects.log_actions(
            user_id=_user_id(request),
            queryset=[rule],
            action_flag=CHANGE,
            change_message=str(message),
            single_object=True,
        )
        return
    LogEntry.objects.create(
        user_id=_user_id(request),
        content_type=ContentType.objects.get_for_model(Dashboard, for_concrete_model=False),
        object_id=scope,
        object_repr=str(_("%(scope)s (code default)") % {"scope": scope})[:200],
        action_flag=CHANGE,
        change_message=str(message),
    )


def _user_id(request: HttpRequest) -> Any:
    # admin_view() lets only a logged-in staff user in: never AnonymousUser.
    return cast("AbstractBaseUser", request.user).pk


def _where(rule: Rule | None, scope: str) -> str:
    if rule is not None:
        return str(_("rule %(rule)s") % {"rule": rule.name})
    return str(_("the code defaults of %(scope)s") % {"scope": scope})


def _back(
    request: HttpRequest,
    next_url: object,
    rule: Rule | None = None,
    scope: str = "",
    key: str = "",
) -> str:
    """Where the form was (``next``, a path of this site), else the key's page."""
    if (
        isinstance(next_url, str)
        and next_url.startswith("/")
        and url_has_allowed_host_and_scheme(
            next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        )
    ):
        return next_url
    url = reverse("admin:django_throttle_dashboard_key")
    if not key:
        return url
    where = {"rule": rule.pk} if rule is not None else {"scope": scope}
    return url + "?" + urlencode({**where, "key": key})
