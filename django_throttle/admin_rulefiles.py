"""Rules as files in the admin: the export action's download and the import page.

Between the preview and the apply step the uploaded text travels in a signed form field
(django.core.signing), not in the session: nothing is kept on the server (any session
backend, cookies included; no 16 MiB session row read on every later request), and what is
applied is exactly what was previewed, since an altered field fails the signature."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.http import content_disposition_header
from django.utils.text import capfirst
from django.utils.timezone import localtime
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from .dashboard.actions import may
from .management.rulefiles import (
    FIELDS,
    MAX_FILE_BYTES,
    Plan,
    RuleFileError,
    dump,
    export_rules,
    hold_rules,
    import_rules,
    load,
    parse,
)
from .models import Override, Rule

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser

    _RuleModelAdmin = admin.ModelAdmin[Rule]
else:
    _RuleModelAdmin = admin.ModelAdmin

__all__ = ("ImportForm", "export_response", "import_page")

TEMPLATE = "admin/django_throttle/rule/import.html"
PREVIEW_MAX_AGE = 3600  # seconds within which a preview may be applied
SALT = "django_throttle.rule_import"
# What the apply form carries besides the token, well over: CSRF token, field names.
FORM_OVERHEAD = 1024
CHUNK = 500  # names per query, under any database's limit on parameters


# -- export --------------------------------------------------------------------------------


def export_response(selection: QuerySet[Rule]) -> HttpResponse:
    """The selected rules as a download in the throttle_export format: YAML when PyYAML
    imports, else JSON."""
    data = export_rules(selection)
    try:
        text, fmt, content_type = dump(data, "yaml"), "yaml", "application/yaml"
    except RuleFileError:  # no PyYAML
        text, fmt, content_type = dump(data, "json"), "json", "application/json"
    stamp = timezone.localtime().strftime("%Y%m%d-%H%M%S")
    response = HttpResponse(text, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = content_disposition_header(
        True, f"throttle-rules-{stamp}.{fmt}"
    )
    return response


# -- import: the upload, and the signed text it becomes -------------------------------------


class ImportForm(forms.Form):
    file = forms.FileField(
        label=_("Rule file"),
        help_text=_(
            "YAML or JSON, as throttle_export or the action Export selected rules writes it "
            "(a name ending in .json is read as JSON); at most 16 MiB."
        ),
    )
    prune = forms.BooleanField(
        label=_("Delete the rules the file does not name"),
        required=False,
    )


@dataclass(frozen=True)
class Upload:
    """A rule file as uploaded, checked already: what the preview shows and apply writes."""

    name: str
    fmt: str
    text: str
    prune: bool

    def sign(self, user: Any, plan: Plan) -> str:
        """The upload and the plan it was previewed with, signed for this user."""
        payload = {
            "name": self.name,
            "fmt": self.fmt,
            "text": self.text,
            "prune": self.prune,
            "delete": plan.delete,
            "plan": _digest(plan),
        }
        return signing.dumps(payload, salt=_salt(user), compress=True)

    @classmethod
    def unsigned(cls, token: str, user: Any) -> tuple[Upload, list[str], str]:
        """The upload, the names its preview deleted and its plan's digest; BadSignature
        (SignatureExpired) for a token altered, another user's, or too old."""
        payload = signing.loads(token, salt=_salt(user), max_age=PREVIEW_MAX_AGE)
        upload = cls(payload["name"], payload["fmt"], payload["text"], payload["prune"])
        return upload, list(payload["delete"]), str(payload["plan"])


def _salt(user: Any) -> str:
    return f"{SALT}:{user.pk}"


def _digest(plan: Plan) -> str:
    """What a preview showed: created, changed (fields and values before) and deleted rules."""
    shown = [plan.create, plan.change, plan.delete, plan.before]
    text = json.dumps(shown, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


# -- import: the page ------------------------------------------------------------------------


class _PlanChanged(Exception):
    """The rules changed between the preview and the apply step, or the plan is not this
    user's to apply (his permissions changed since): roll back, preview again."""

    def __init__(self, plan: Plan, changed: bool) -> None:
        super().__init__()
        self.plan = plan
        self.changed = changed


def import_page(model_admin: _RuleModelAdmin, request: HttpRequest) -> HttpResponse:
    """Upload (GET, then POST with a file), preview, apply (POST with the signed token)."""
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    if request.method == "POST" and "token" in request.POST:
        return _apply(model_admin, request)
    if request.method == "POST":
        form = ImportForm(request.POST, request.FILES)
        if form.is_valid():
            upload_or_error = _read(form.cleaned_data["file"], form.cleaned_data["prune"])
            if isinstance(upload_or_error, str):
                form.add_error("file", upload_or_error)
            else:
                upload, plan = upload_or_error
                return _preview(model_admin, request, upload, plan)
        return _render(model_admin, request, {"form": form}, status=400)
    return _render(model_admin, request, {"form": ImportForm()})


def _read(file: Any, prune: bool) -> tuple[Upload, Plan] | str:
    """The uploaded file checked as throttle_import checks it, or what is wrong with it."""
    name = str(file.name or "")
    fmt = "json" if name.lower().endswith(".json") else "yaml"
    # One byte past the cap is enough to refuse a larger file.
    raw = file.read(MAX_FILE_BYTES + 1)
    try:
        plan = import_rules(parse(raw, fmt), prune=prune, dry_run=True)
    except RuleFileError as exc:
        return gettext("%(file)s: %(problem)s; nothing was written.") % {
            "file": name,
            "problem": exc,
        }
    return Upload(name, fmt, raw.decode("utf-8-sig"), prune), plan


def _preview(
    model_admin: _RuleModelAdmin,
    request: HttpRequest,
    upload: Upload,
    plan: Plan,
    notice: str = "",
) -> HttpResponse:
    problems = _refused(model_admin, request, plan)
    token = upload.sign(request.user, plan)
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is not None and len(token) + FORM_OVERHEAD > limit:
        problems.append(
            gettext(
                "This file is too large to apply from the admin (the form sending it back may "
                "carry %(limit)s bytes, DATA_UPLOAD_MAX_MEMORY_SIZE): use manage.py "
                "throttle_import."
            )
            % {"limit": limit}
        )
    changes = bool(plan.create or plan.change or plan.delete)
    context = {
        "upload": upload,
        "created": [(name, _in_words(plan.after[name])) for name in plan.create],
        "changed": [(name, _changes(plan, name, fields)) for name, fields in plan.change],
        "deleted": _deleted(plan.delete),
        "unchanged": len(plan.unchanged),
        "notice": notice,
        "problems": problems,
        "token": token if changes and not problems else "",
        "nothing": not changes,
    }
    return _render(model_admin, request, context)


def _apply(model_admin: _RuleModelAdmin, request: HttpRequest) -> HttpResponse:
    try:
        upload, doomed_names, previewed = Upload.unsigned(request.POST["token"], request.user)
    except signing.SignatureExpired:
        return _start_again(
            model_admin,
            request,
            gettext("This preview is over an hour old: upload the file again."),
        )
    except signing.BadSignature:
        return _start_again(
            model_admin, request, gettext("This preview cannot be applied: upload the file again.")
        )
    try:
        with transaction.atomic():
            hold_rules()  # before the first read: another apply under way finishes first
            doomed = _named(doomed_names)  # read before they go, for the admin log
            plan = import_rules(load(upload.text, upload.fmt), prune=upload.prune, dry_run=False)
            changed = _digest(plan) != previewed
            if changed or _refused(model_admin, request, plan):
                raise _PlanChanged(plan, changed)
            _log(request, upload, plan, doomed)
    except RuleFileError as exc:  # a group deleted since the preview, say
        message = gettext("%(file)s: %(problem)s; nothing was written.")
        return _start_again(model_admin, request, message % {"file": upload.name, "problem": exc})
    except _PlanChanged as refused:  # rolled back: nothing was written
        notice = ""
        if refused.changed:
            notice = gettext(
                "The rules changed since the preview, and nothing was written: this is what "
                "the file would do now."
            )
        return _preview(model_admin, request, upload, refused.plan, notice)
    messages.success(request, _summary(upload, plan))
    changelist = reverse(
        f"{model_admin.admin_site.name}:{Rule._meta.app_label}_{Rule._meta.model_name}_changelist"
    )
    return HttpResponseRedirect(changelist)


def _start_again(model_admin: _RuleModelAdmin, request: HttpRequest, error: str) -> HttpResponse:
    form = ImportForm()
    return _render(model_admin, request, {"form": form, "error": error}, status=400)


def _refused(model_admin: _RuleModelAdmin, request: HttpRequest, plan: Plan) -> list[str]:
    """What the plan does that this user may not do (the page itself needs change), as the
    admin's own pages would refuse it: overrides included."""
    problems = []
    if plan.create and not model_admin.has_add_permission(request):
        problems.append(gettext("The file creates rules, and you may not add rules."))
    if plan.delete and not model_admin.has_delete_permission(request):
        problems.append(gettext("The file deletes rules (prune), and you may not delete rules."))
    if any(plan.after[name]["overrides"] for name in plan.create) and not may(
        request, "add", Override
    ):
        problems.append(
            gettext("The file creates rules with overrides, and you may not add overrides.")
        )
    replaces = any("overrides" in fields for _name, fields in plan.change)
    if replaces and not all(may(request, a, Override) for a in ("add", "change", "delete")):
        problems.append(
            gettext(
                "The file replaces the overrides of rules, which takes the permissions to add, "
                "change and delete overrides."
            )
        )
    # Deleting a rule deletes its overrides: the admin's delete page asks for that too.
    if plan.delete and not may(request, "delete", Override) and _with_overrides(plan.delete):
        problems.append(
            gettext(
                "The file deletes rules that have overrides (prune), and you may not delete "
                "overrides."
            )
        )
    return problems


def _with_overrides(names: list[str]) -> bool:
    return any(
        Override.objects.filter(rule__name__in=names[start : start + CHUNK]).exists()
        for start in range(0, len(names), CHUNK)
    )


def _render(
    model_admin: _RuleModelAdmin,
    request: HttpRequest,
    context: dict[str, Any],
    status: int = 200,
) -> HttpResponse:
    opts = Rule._meta
    full = {
        **model_admin.admin_site.each_context(request),
        "opts": opts,
        "title": _("Import rules"),
        "max_mib": MAX_FILE_BYTES // 2**20,
        **context,
    }
    return TemplateResponse(request, TEMPLATE, full, status=status)


# -- import: the diff shown ------------------------------------------------------------------


@dataclass(frozen=True)
class FieldChange:
    label: str
    old: str
    new: str


def _changes(plan: Plan, name: str, fields: list[str]) -> list[FieldChange]:
    before, after = plan.before[name], plan.after[name]
    return [FieldChange(_label(f), _shown(f, before[f]), _shown(f, after[f])) for f in fields]


def _label(name: str) -> str:
    if name == "overrides":
        return capfirst(str(_("overrides")))
    field = Rule._meta.get_field(name)
    return capfirst(str(getattr(field, "verbose_name", name)))


def _shown(name: str, value: Any) -> str:
    """A field's value as the diff shows it: choices by their label, lists joined."""
    if value is None or value == "" or value == []:
        return "-"
    if name == "overrides":
        return ", ".join(_override_shown(*override) for override in value)
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, bool):
        return gettext("yes") if value else gettext("no")
    choices = dict(Rule._meta.get_field(name).flatchoices)  # type: ignore[union-attr]
    return str(choices.get(value, value))


def _override_shown(key: str, limit: int | None, exempt: bool, ends: datetime | None) -> str:
    shown = f"{key} ({gettext('exempt')})" if exempt else f"{key}: {limit}"
    if ends is not None:
        shown += " " + gettext("until %(when)s") % {
            "when": date_format(localtime(ends), "DATETIME_FORMAT")
        }
    return shown


def _in_words(after: dict[str, Any]) -> str:
    return Rule(**{key: after[key] for key in FIELDS}).explanation


def _named(names: list[str]) -> list[Rule]:
    found: list[Rule] = []
    for start in range(0, len(names), CHUNK):
        found.extend(Rule.objects.filter(name__in=names[start : start + CHUNK]))
    return found


def _deleted(names: list[str]) -> list[tuple[str, str]]:
    words = {rule.name: rule.explanation for rule in _named(names)}
    return [(name, words.get(name, "")) for name in names]


# -- import: the admin log -------------------------------------------------------------------


def _log(request: HttpRequest, upload: Upload, plan: Plan, doomed: list[Rule]) -> None:
    """One admin log entry per rule created, changed or deleted, naming the file."""
    user_id = cast("AbstractBaseUser", request.user).pk  # admin_view() lets in staff only
    content_type = ContentType.objects.get_for_model(Rule, for_concrete_model=False)
    changed = dict(plan.change)
    entries = []

    def entry(rule: Rule, flag: int, message: str) -> LogEntry:
        return LogEntry(
            user_id=user_id,
            content_type=content_type,
            object_id=str(rule.pk),
            object_repr=str(rule)[:200],
            action_flag=flag,
            change_message=message,
        )

    file = {"file": upload.name}
    for rule in _named(plan.create):
        entries.append(entry(rule, ADDITION, gettext("Added by importing %(file)s.") % file))
    for rule in _named(list(changed)):
        fields = ", ".join(_label(f) for f in changed[rule.name])
        message = gettext("Changed %(fields)s by importing %(file)s.") % {**file, "fields": fields}
        entries.append(entry(rule, CHANGE, message))
    for rule in doomed:
        entries.append(entry(rule, DELETION, gettext("Deleted by importing %(file)s.") % file))
    LogEntry.objects.bulk_create(entries)


def _summary(upload: Upload, plan: Plan) -> str:
    counts = {
        "file": upload.name,
        "created": ngettext("%(n)d rule created", "%(n)d rules created", len(plan.create))
        % {"n": len(plan.create)},
        "changed": ngettext("%(n)d changed", "%(n)d changed", len(plan.change))
        % {"n": len(plan.change)},
        "deleted": ngettext("%(n)d deleted", "%(n)d deleted", len(plan.delete))
        % {"n": len(plan.delete)},
        "unchanged": ngettext("%(n)d unchanged", "%(n)d unchanged", len(plan.unchanged))
        % {"n": len(plan.unchanged)},
    }
    return (
        gettext("Imported %(file)s: %(created)s, %(changed)s, %(deleted)s, %(unchanged)s.") % counts
    )
