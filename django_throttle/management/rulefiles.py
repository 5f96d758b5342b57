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
from django.db import connections, models, router, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from ..models import Override, Rule
from ..networks import parse_networks
from ..signals import rules_written

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
    """Validate every rule as the admin does; write all of them or nothing.

    The table is read in a few queries and compared in memory: only what changed is
    written, in bulk, in one transaction, announced once. A dry run, or a file that changes
    nothing, writes nothing."""
    plan = Plan()
    seen: set[str] = set()
    entries = []
    for index, entry in enumerate(data["rules"], 1):
        name = _name_of(entry, index)
        if name in seen:
            raise RuleFileError(f"rule {name!r} appears twice")
        seen.add(name)
        entries.append((name, entry))
    current = _Current()
    staged = [_stage(entry, name, current) for name, entry in entries]
    for item in staged:
        if item.new:
            plan.create.append(item.rule.name)
        elif item.changed:
            plan.change.append((item.rule.name, item.changed))
        else:
            plan.unchanged.append(item.rule.name)
    if prune:
        plan.delete = sorted(name for name in current.rules if name not in seen)
    if not dry_run and (plan.create or plan.change or plan.delete):
        _write([item for item in staged if item.new or item.changed], plan.delete, current)
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


class _Current:
    """The rule table as it is, read in five queries: rules by name, group names, and each
    rule's groups, exempt groups and overrides."""

    def __init__(self) -> None:
        # The timestamps are not compared, and need no converting (a third of the read).
        rows = Rule.objects.defer("created_at", "updated_at")
        self.rules = {rule.name: rule for rule in rows}
        self.defaults = {key: _default(key) for key in FIELDS}
        self.groups = dict(Group.objects.values_list("name", "pk"))
        names = {pk: name for name, pk in self.groups.items()}
        self.members = self._names(Rule.groups.through, names)
        self.exempt = self._names(Rule.exempt_groups.through, names)
        self.overrides: dict[int, list[tuple[str, int | None, bool]]] = {}
        for rule_id, key, limit, exempt in Override.objects.values_list(
            "rule_id", "key", "limit", "exempt"
        ):
            self.overrides.setdefault(rule_id, []).append((key, limit, exempt))

    @staticmethod
    def _names(through: Any, names: dict[int, str]) -> dict[int, list[str]]:
        found: dict[int, list[str]] = {}
        for rule_id, group_id in through.objects.values_list("rule_id", "group_id"):
            found.setdefault(rule_id, []).append(names[group_id])
        return found

    def snapshot(self, rule: Rule) -> dict[str, Any]:
        data = {key: getattr(rule, key) for key in FIELDS}
        data["groups"] = sorted(self.members.get(rule.pk, ()))
        data["exempt_groups"] = sorted(self.exempt.get(rule.pk, ()))
        data["overrides"] = sorted(self.overrides.get(rule.pk, ()), key=_override_order)
        return data


def _override_order(item: tuple[str, int | None, bool]) -> tuple[str, int, bool]:
    return (item[0], -1 if item[1] is None else item[1], item[2])


@dataclass
class _Staged:
    """One rule of the file, validated: the row as it will be, and what to write."""

    rule: Rule
    new: bool
    changed: list[str]
    groups: list[int]
    exempt_groups: list[int]
    overrides: list[Override]


def _stage(entry: dict[str, Any], name: str, current: _Current) -> _Staged:
    rule = current.rules.get(name)
    new = rule is None
    if rule is None:
        rule = Rule(name=name)
    before = {} if new else current.snapshot(rule)
    for key in FIELDS:
        # The file says everything about a rule: a field it leaves out takes the default.
        value = entry[key] if key in entry else current.defaults[key]
        if key == "exempt_networks" and isinstance(value, list):
            value = ", ".join(str(v) for v in value)
        _check_type(name, key, value)
        setattr(rule, key, value)
    try:
        # What save() runs, as the admin does; the one unique field, the name, is how rules
        # are matched, so it needs no query.
        # (The timestamps, which save() sets, are excluded: not loaded, nothing to check.)
        rule.full_clean(exclude=["created_at", "updated_at"], validate_unique=False)
    except ValidationError as exc:
        details = "; ".join(
            f"{field}: {' '.join(messages)}"
            for field, messages in getattr(exc, "message_dict", {"rule": exc.messages}).items()
        )
        raise RuleFileError(f"rule {name!r}: {details}") from None
    groups = _groups(entry.get("groups", []), name, "groups", current)
    exempt_groups = _groups(entry.get("exempt_groups", []), name, "exempt_groups", current)
    overrides = _overrides(rule, entry.get("overrides", []))
    after = {key: getattr(rule, key) for key in FIELDS}
    after["groups"] = sorted(set(entry.get("groups", [])))
    after["exempt_groups"] = sorted(set(entry.get("exempt_groups", [])))
    after["overrides"] = sorted(
        ((o.key, o.limit, o.exempt) for o in overrides), key=_override_order
    )
    changed = [] if new else [k for k in after if after[k] != before[k]]
    return _Staged(rule, new, changed, groups, exempt_groups, overrides)


def _write(staged: list[_Staged], delete: list[str], current: _Current) -> None:
    """Write what changed, in bulk: validated already, so through the plain QuerySet (the
    model's validates each row again, with a query for its unique name)."""
    plain: models.QuerySet[Rule] = models.QuerySet(model=Rule)
    now = timezone.now()
    with transaction.atomic():
        created = [item.rule for item in staged if item.new]
        plain.bulk_create(created)
        if any(rule.pk is None for rule in created):  # a database that returns no keys
            pks = dict(plain.values_list("name", "pk"))
            for rule in created:
                rule.pk = pks[rule.name]
        changed = [item for item in staged if not item.new]
        for item in changed:
            item.rule.updated_at = now  # what save() sets, for DatabaseVersion's fingerprint
        fields = sorted({f for item in changed for f in item.changed if f in FIELDS})
        if changed:
            _update([item.rule for item in changed], [*fields, "updated_at"])
        _relations(staged)
        for chunk in _chunks([current.rules[name].pk for name in delete]):
            Rule.objects.filter(pk__in=chunk).delete()
        rules_written.send(sender=Rule)  # every process reloads, once this commits


def _update(rules: list[Rule], names: list[str]) -> None:
    """One UPDATE of these fields, run for every row (executemany): bulk_update() builds a
    CASE per row and field, seconds of Python for 10,000 rules."""
    db = connections[router.db_for_write(Rule)]
    quote = db.ops.quote_name
    fields = []
    for name in names:
        field = Rule._meta.get_field(name)
        assert isinstance(field, models.Field)
        fields.append(field)
    assignments = ", ".join(f"{quote(str(f.column))} = %s" for f in fields)
    key = Rule._meta.pk
    assert key is not None
    table, pk = quote(Rule._meta.db_table), quote(str(key.column))
    rows = [
        [f.get_db_prep_save(getattr(rule, f.attname), db) for f in fields] + [rule.pk]
        for rule in rules
    ]
    with db.cursor() as cursor:
        cursor.executemany(f"UPDATE {table} SET {assignments} WHERE {pk} = %s", rows)


def _relations(staged: list[_Staged]) -> None:
    """Groups, exempt groups and overrides of the rules whose own changed (all of a new one)."""
    tables: tuple[tuple[Any, str], ...] = (
        (Rule.groups.through, "groups"),
        (Rule.exempt_groups.through, "exempt_groups"),
    )
    for through, name in tables:
        touched = [item for item in staged if item.new or name in item.changed]
        for chunk in _chunks([item.rule.pk for item in touched if not item.new]):
            through.objects.filter(rule_id__in=chunk).delete()
        through.objects.bulk_create(
            through(rule_id=item.rule.pk, group_id=group)
            for item in touched
            for group in getattr(item, name)
        )
    overrides: models.QuerySet[Override] = models.QuerySet(model=Override)
    touched = [item for item in staged if item.new or "overrides" in item.changed]
    for chunk in _chunks([item.rule.pk for item in touched if not item.new]):
        overrides.filter(rule_id__in=chunk).delete()
    rows = []
    for item in touched:
        for override in item.overrides:
            override.rule = item.rule
            rows.append(override)
    overrides.bulk_create(rows)


def _chunks(pks: list[Any], size: int = 500) -> list[list[Any]]:
    """Primary keys in lists short enough for any database's limit on query parameters."""
    return [pks[i : i + size] for i in range(0, len(pks), size)]


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


def _groups(names: Any, rule: str, field_name: str, current: _Current) -> list[int]:
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise RuleFileError(f"rule {rule!r}: {field_name} must be a list of group names")
    missing = set(names) - set(current.groups)
    if missing:
        raise RuleFileError(f"rule {rule!r}: {field_name}: no group {', '.join(sorted(missing))}")
    return sorted({current.groups[name] for name in names})


def _overrides(rule: Rule, entries: Any) -> list[Override]:
    """The overrides of a file's rule, each validated as save() does (its rule excluded: it
    may not be written yet)."""
    if not isinstance(entries, list):
        raise RuleFileError(f"rule {rule.name!r}: overrides must be a list")
    found: dict[str, Override] = {}
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
        override = Override(
            key=entry.get("key", ""),
            limit=entry.get("limit"),
            exempt=bool(entry.get("exempt", False)),
        )
        try:
            override.full_clean(exclude=["rule"], validate_unique=False)
            if override.key in found:
                raise ValidationError(_("This client key has an override of this rule already."))
        except ValidationError as exc:
            raise RuleFileError(
                f"rule {rule.name!r}: override {entry.get('key')!r}: {' '.join(exc.messages)}"
            ) from None
        found[override.key] = override
    return list(found.values())


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise RuleFileError(
            'YAML needs PyYAML: pip install "django-throttle-rules[yaml]", or use --format json'
        ) from None
    return yaml
