"""Rules as files: the one format of ``throttle_export`` and ``throttle_import``.

```yaml
rules:
  - name: api
    scope: /api/
    limit: 100
    per: 15
    unit: minute
    exempt_networks: ["10.0.0.0/8"]
    groups: []                    # group names
    overrides:
      - {key: "user:42", limit: 1000}
      - {key: "ip:203.0.113.7", exempt: true}
```

Every Rule field may appear under its own name; a missing one takes the model's default.
Rules are matched by name. JSON is the same structure.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import models, transaction

from ..models import Override, Rule
from ..networks import parse_networks

# The Rule fields a file carries, in the order they are written.
FIELDS = (
    "scope",
    "methods",
    "key_kind",
    "key_arg",
    "limit",
    "per",
    "unit",
    "algorithm",
    "burst",
    "block_seconds",
    "action",
    "fail_mode",
    "applies_to",
    "exempt_staff",
    "exempt_networks",
    "enabled",
)
RELATED = ("groups", "exempt_groups", "overrides")
INTEGERS = ("limit", "per", "burst", "block_seconds")
BOOLEANS = ("exempt_staff", "enabled")


class RuleFileError(ValueError):
    """What is wrong with a file, naming the rule and the field."""


# -- export ---------------------------------------------------------------------------


def export_rules() -> dict[str, Any]:
    rules = []
    for rule in Rule.objects.order_by("name").prefetch_related(
        "groups", "exempt_groups", "overrides"
    ):
        entry: dict[str, Any] = {"name": rule.name}
        for name in FIELDS:
            value = getattr(rule, name)
            if name == "exempt_networks":
                # A row written around validation is exported as it is.
                with contextlib.suppress(ValueError):
                    value = [str(n) for n in parse_networks(value)]
            entry[name] = value
        entry["groups"] = sorted(g.name for g in rule.groups.all())
        entry["exempt_groups"] = sorted(g.name for g in rule.exempt_groups.all())
        entry["overrides"] = [
            {"key": o.key, "exempt": True} if o.exempt else {"key": o.key, "limit": o.limit}
            for o in sorted(rule.overrides.all(), key=lambda o: o.key)
        ]
        rules.append(entry)
    return {"rules": rules}


def dump(data: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    return str(_yaml().safe_dump(data, sort_keys=False, allow_unicode=True))


# -- import ---------------------------------------------------------------------------


def load(text: str, fmt: str) -> dict[str, Any]:
    try:
        data = json.loads(text) if fmt == "json" else _yaml().safe_load(text)
    except ValueError as exc:  # json.JSONDecodeError, yaml.YAMLError are ValueErrors or not
        raise RuleFileError(f"the file cannot be read as {fmt.upper()}: {exc}") from None
    except Exception as exc:  # yaml.YAMLError
        raise RuleFileError(f"the file cannot be read as {fmt.upper()}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise RuleFileError('the file must hold a list under "rules"')
    return data


@dataclass
class Plan:
    """What an import does: rules to create, to change (with the fields), to delete."""

    create: list[str] = field(default_factory=list)
    change: list[tuple[str, list[str]]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"create {name}" for name in self.create]
        out += [f"change {name}: {', '.join(fields)}" for name, fields in self.change]
        out += [f"delete {name}" for name in self.delete]
        out += [f"unchanged {name}" for name in self.unchanged]
        return out


def import_rules(data: dict[str, Any], *, prune: bool, dry_run: bool) -> Plan:
    """Validate every rule as the admin does; write all of them or nothing."""
    plan = Plan()
    seen: set[str] = set()
    with transaction.atomic():
        for index, entry in enumerate(data["rules"], 1):
            name = _name_of(entry, index)
            if name in seen:
                raise RuleFileError(f"rule {name!r} appears twice")
            seen.add(name)
            _apply(entry, name, plan)
        if prune:
            extra = Rule.objects.exclude(name__in=seen).order_by("name")
            plan.delete = list(extra.values_list("name", flat=True))
            extra.delete()
        if dry_run:
            transaction.set_rollback(True)
    return plan


def _name_of(entry: Any, index: int) -> str:
    if not isinstance(entry, dict):
        raise RuleFileError(f"rule {index} is not a mapping of fields")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise RuleFileError(f"rule {index} has no name")
    unknown = set(entry) - {"name", *FIELDS, *RELATED}
    if unknown:
        raise RuleFileError(f"rule {name!r}: unknown field(s) {', '.join(sorted(unknown))}")
    return name.strip()


def _apply(entry: dict[str, Any], name: str, plan: Plan) -> None:
    rule = Rule.objects.filter(name=name).first()
    new = rule is None
    if rule is None:
        rule = Rule(name=name)
    before = _snapshot(rule, new)
    for key in FIELDS:
        # The file says everything about a rule: a field it leaves out takes the default.
        value = entry[key] if key in entry else _default(key)
        if key == "exempt_networks" and isinstance(value, list):
            value = ", ".join(str(v) for v in value)
        _check_type(name, key, value)
        setattr(rule, key, value)
    try:
        rule.save()  # full_clean(): validated as the admin does
        rule.groups.set(_groups(entry.get("groups", []), name, "groups"))
        rule.exempt_groups.set(_groups(entry.get("exempt_groups", []), name, "exempt_groups"))
        _overrides(rule, entry.get("overrides", []))
    except ValidationError as exc:
        details = "; ".join(
            f"{field}: {' '.join(messages)}"
            for field, messages in getattr(exc, "message_dict", {"rule": exc.messages}).items()
        )
        raise RuleFileError(f"rule {name!r}: {details}") from None
    after = _snapshot(rule, False)
    if new:
        plan.create.append(name)
    else:
        changed = [k for k in after if after[k] != before[k]]
        (plan.change.append((name, changed)) if changed else plan.unchanged.append(name))


def _check_type(rule: str, key: str, value: Any) -> None:
    """A file's value of the wrong type is refused, never coerced (1.5 is not 1, "no" is not
    False)."""
    if key in INTEGERS and value is not None and (type(value) is not int):
        raise RuleFileError(f"rule {rule!r}: {key}: a whole number, not {value!r}")
    if key in BOOLEANS and type(value) is not bool:
        raise RuleFileError(f"rule {rule!r}: {key}: true or false, not {value!r}")
    if key not in INTEGERS and key not in BOOLEANS and not isinstance(value, str):
        raise RuleFileError(f"rule {rule!r}: {key}: text, not {value!r}")


def _default(name: str) -> Any:
    model_field = Rule._meta.get_field(name)
    assert isinstance(model_field, models.Field)
    return model_field.get_default()


def _snapshot(rule: Rule, new: bool) -> dict[str, Any]:
    if new:
        return {}
    data = {key: getattr(rule, key) for key in FIELDS}
    data["groups"] = sorted(g.name for g in rule.groups.all())
    data["exempt_groups"] = sorted(g.name for g in rule.exempt_groups.all())
    data["overrides"] = sorted((o.key, o.limit, o.exempt) for o in rule.overrides.all())
    return data


def _groups(names: Any, rule: str, field_name: str) -> list[Group]:
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise RuleFileError(f"rule {rule!r}: {field_name} must be a list of group names")
    groups = list(Group.objects.filter(name__in=names))
    missing = set(names) - {g.name for g in groups}
    if missing:
        raise RuleFileError(f"rule {rule!r}: {field_name}: no group {', '.join(sorted(missing))}")
    return groups


def _overrides(rule: Rule, entries: Any) -> None:
    if not isinstance(entries, list):
        raise RuleFileError(f"rule {rule.name!r}: overrides must be a list")
    rule.overrides.all().delete()
    for entry in entries:
        if (
            not isinstance(entry, dict)
            or set(entry) - {"key", "limit", "exempt"}
            or not isinstance(entry.get("key"), str)
            or type(entry.get("exempt", False)) is not bool
            or (entry.get("limit") is not None and type(entry.get("limit")) is not int)
        ):
            raise RuleFileError(
                f"rule {rule.name!r}: an override is {{key: text, limit: number}} or "
                "{key: text, exempt: true}"
            )
        try:
            Override.objects.create(
                rule=rule,
                key=entry.get("key", ""),
                limit=entry.get("limit"),
                exempt=bool(entry.get("exempt", False)),
            )
        except ValidationError as exc:
            raise RuleFileError(
                f"rule {rule.name!r}: override {entry.get('key')!r}: {' '.join(exc.messages)}"
            ) from None


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise RuleFileError(
            'YAML needs PyYAML: pip install "django-throttle-rules[yaml]", or use --format json'
        ) from None
    return yaml
