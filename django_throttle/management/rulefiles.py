"""Rules as files: the one YAML or JSON format of ``throttle_export`` and ``throttle_import``."""

from __future__ import annotations

import contextlib
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.db import connections, models, router, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _

from ..models import Override, Rule
from ..networks import canonical_networks, parse_networks
from ..rules import RULE_SETTINGS
from ..signals import rules_written

# The Rule fields a file carries, in the order they are written.
FIELDS = (*RULE_SETTINGS, "enabled")
RELATED = ("groups", "exempt_groups", "overrides")
INTEGERS = ("limit", "per", "burst", "block_seconds", "block_growth")
BOOLEANS = ("exempt_staff", "enabled")


class RuleFileError(ValueError):
    """What is wrong with a file, naming the rule and the field."""


# -- export ---------------------------------------------------------------------------


def export_rules(selection: models.QuerySet[Rule] | None = None) -> dict[str, Any]:
    """Every rule, or those of ``selection`` (the admin's export action)."""
    rules = []
    queryset = Rule.objects.all() if selection is None else selection
    for rule in queryset.order_by("name").prefetch_related("groups", "exempt_groups", "overrides"):
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
            _exported(o) for o in sorted(rule.overrides.all(), key=lambda o: o.key)
        ]
        rules.append(entry)
    return {"rules": rules}


def _exported(override: Override) -> dict[str, Any]:
    entry: dict[str, Any] = {"key": override.key}
    if override.exempt:
        entry["exempt"] = True
    else:
        entry["limit"] = override.limit
    if override.expires_at is not None:
        entry["expires_at"] = override.expires_at.isoformat()  # a string in YAML too (quoted)
    return entry


def dump(data: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    return str(_yaml().safe_dump(data, sort_keys=False, allow_unicode=True))


# -- import ---------------------------------------------------------------------------

# Bounds on what a rule file may make this process do (docs/bounds.md, "Rule files"). 10,000
# rules with every field take 3.5 MB of YAML or 5.2 MB of indented JSON and 410,000 values.
MAX_FILE_BYTES = 16 * 2**20
MAX_VALUES = 1_000_000  # mappings, lists and scalars: what memory grows with
MAX_DEPTH = 16  # a valid file nests 5 deep (rules, a rule, overrides, an override, a value)
MAX_NUMBER = 20  # characters of a number (MAX_LIMIT has 10 digits)

# What no database stores as text: NUL (PostgreSQL refuses it) and lone surrogates (no
# encoding has them); and the escapes by which either can reach a parsed string (JSON's \u,
# YAML's \0, \x, \u and \U; a doubled backslash only makes the check run for nothing).
_NOT_TEXT = re.compile("[\x00\ud800-\udfff]")
_ESCAPES = re.compile(r"\\[0xuU]")


def parse(raw: bytes, fmt: str) -> dict[str, Any]:
    """A rule file's bytes as import_rules() takes them; RuleFileError says what is wrong."""
    if len(raw) > MAX_FILE_BYTES:
        raise RuleFileError(
            f"the file is larger than {MAX_FILE_BYTES // 2**20} MiB, the most a rule file may be"
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise RuleFileError(
            f"the file is not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line}, "
            f"column {column}"
        ) from None
    return load(text, fmt)


def load(text: str, fmt: str) -> dict[str, Any]:
    """A rule file's text, parsed and checked for shape; RuleFileError says what is wrong."""
    if len(text) > MAX_FILE_BYTES:
        raise RuleFileError(
            f"the file is larger than {MAX_FILE_BYTES // 2**20} MiB, the most a rule file may be"
        )
    text = text.removeprefix("\ufeff")
    found = _NOT_TEXT.search(text)
    if found:  # said before either parser does, in its own words
        line = text.count("\n", 0, found.start()) + 1
        raise RuleFileError(f"line {line}: {_text_problem(found.group())}")
    data = _load_json(text) if fmt == "json" else _load_yaml(text)
    rules = _check_shape(data)
    if _ESCAPES.search(text):
        _check_texts(rules)
    return {**data, "rules": rules}


def _check_shape(data: Any) -> list[dict[str, Any]]:
    """The rules of ``data``; RuleFileError unless it has the shape of a rule file and every
    value the type its field takes."""
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise RuleFileError('the file must hold a list under "rules"')
    for index, entry in enumerate(data["rules"], 1):
        if not isinstance(entry, dict):
            raise RuleFileError(f"rule {index} is not a mapping of fields")
        for key in entry:
            if not isinstance(key, str):
                raise RuleFileError(f"rule {index}: field names are text, not {_show(key)}")
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise RuleFileError(f"rule {index} has no name")
        name = name.strip()
        unknown = set(entry) - {"name", *FIELDS, *RELATED}
        if unknown:
            shown = ", ".join(_printable(key) for key in sorted(unknown))
            raise RuleFileError(f"rule {name!r}: unknown field(s) {shown}")
        for key in FIELDS:
            if key in entry:
                _check_field(name, key, entry[key])
        for key in ("groups", "exempt_groups"):
            names = entry.get(key, [])
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise RuleFileError(f"rule {name!r}: {key} must be a list of group names")
        overrides = entry.get("overrides", [])
        if not isinstance(overrides, list):
            raise RuleFileError(f"rule {name!r}: overrides must be a list")
        for override in overrides:
            _check_override(name, override)
    rules: list[dict[str, Any]] = data["rules"]
    return rules


def _check_field(rule: str, key: str, value: Any) -> None:
    """A value of the wrong type is refused, never coerced (1.5 is not 1, "no" is not False)."""
    if key in INTEGERS:
        if value is not None and type(value) is not int:
            raise RuleFileError(f"rule {rule!r}: {key}: a whole number, not {_show(value)}")
    elif key in BOOLEANS:
        if type(value) is not bool:
            raise RuleFileError(f"rule {rule!r}: {key}: true or false, not {_show(value)}")
    elif key == "exempt_networks" and isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            raise RuleFileError(f"rule {rule!r}: {key}: text or a list of text")
    elif key == "count_statuses" and not isinstance(value, str):
        if not all(_is_status(v) for v in (value if isinstance(value, list) else [value])):
            raise RuleFileError(
                f'rule {rule!r}: {key}: text such as "401,403" or "4xx", a status, or a '
                f"list of them, not {_show(value)}"
            )
    elif not isinstance(value, str):
        raise RuleFileError(f"rule {rule!r}: {key}: text, not {_show(value)}")


def _is_status(value: Any) -> bool:
    """A status as a hand-written file may give it: 401 (YAML reads a number) or "4xx"."""
    return isinstance(value, str) or type(value) is int


def _statuses_text(value: Any) -> Any:
    """count_statuses as the rule keeps it (text), from a file's number or list."""
    if type(value) is int:
        return str(value)
    if isinstance(value, list) and all(_is_status(v) for v in value):
        return ",".join(str(v) for v in value)
    return value


def _check_texts(rules: list[dict[str, Any]]) -> None:
    """Refuse NUL and lone surrogates in any text of the rules, before a query could fail on
    them (the rules' shape is checked: a few levels of lists and mappings)."""
    for index, entry in enumerate(rules, 1):
        for key, value in entry.items():
            pending: list[Any] = [key, value]
            while pending:
                item = pending.pop()
                if isinstance(item, str):
                    found = _NOT_TEXT.search(item)
                    if found:
                        problem = _text_problem(found.group())
                        raise RuleFileError(f"rule {index}: {_printable(key)}: {problem}")
                elif isinstance(item, dict):
                    pending += item
                    pending += item.values()
                elif isinstance(item, list):
                    pending += item


def _text_problem(character: str) -> str:
    if character == "\x00":
        return "a NUL character, which no database stores as text"
    return f"a lone surrogate ({character!r}), which is not Unicode text"


def _printable(text: str) -> str:
    """Text for a message that stderr can print whatever it holds (lone surrogates escaped)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _show(value: Any) -> str:
    """A wrong value in a message: its type for a collection (which may be large), else a
    short repr."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _number_problem(text: str) -> str | None:
    if len(text) > MAX_NUMBER:
        return (
            f"a number {len(text):,} characters long; numbers in a rule file have at most "
            f"{MAX_NUMBER} digits"
        )
    return None


# JSON


# A string runs to its closing quote, or (unterminated: json reports it) to the end of the
# text, so no start can fail and be tried again from the next quote (quadratic).
_JSON_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


def _load_json(text: str) -> Any:
    # json's decoder recurses once per level: measure the nesting first, on the brackets
    # outside strings (removing the innermost pairs once per allowed level).
    brackets = _NOT_BRACKETS.sub("", _JSON_STRINGS.sub("", text))
    values = text.count(",") + len(brackets) // 2 + 1  # at least as many as the file holds
    if values > MAX_VALUES:
        raise RuleFileError(f"the file holds more than {MAX_VALUES:,} values")
    for _depth in range(MAX_DEPTH):
        brackets = brackets.replace("[]", "").replace("{}", "")
    if "[]" in brackets or "{}" in brackets:
        raise RuleFileError(
            f"the file cannot be read as JSON: nested deeper than {MAX_DEPTH} levels"
        )
    if brackets:  # left unclosed, or closed without being opened (or a string left open)
        raise RuleFileError("the file cannot be read as JSON: its brackets do not match")
    try:
        return json.loads(
            text,
            parse_int=_json_int,
            parse_float=_json_float,
            parse_constant=_json_constant,
            object_pairs_hook=_json_object,
        )
    except json.JSONDecodeError as exc:
        raise RuleFileError(f"the file cannot be read as JSON: {exc}") from None


def _json_int(text: str) -> int:
    problem = _number_problem(text)
    if problem:
        raise RuleFileError(f"the file cannot be read as JSON: {problem}")
    return int(text)


def _json_float(text: str) -> float:
    problem = _number_problem(text)
    if problem:
        raise RuleFileError(f"the file cannot be read as JSON: {problem}")
    value = float(text)
    if not math.isfinite(value):
        raise RuleFileError(f"the file cannot be read as JSON: {text} is not a finite number")
    return value


def _json_constant(text: str) -> float:
    raise RuleFileError(f"the file cannot be read as JSON: {text} is not a finite number")


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    mapping = dict(pairs)
    if len(mapping) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RuleFileError(
                    f"the file cannot be read as JSON: {key!r} appears twice in one mapping"
                )
            seen.add(key)
    return mapping


# YAML

_TAG = "tag:yaml.org,2002:"
# The scalar types a rule file's YAML may hold besides text; anything else PyYAML's safe
# loader could build (bytes, sets, ordered pairs) has no place in one.
_SCALAR_TYPES = frozenset(_TAG + t for t in ("null", "bool", "int", "float", "timestamp"))


def _load_yaml(text: str) -> Any:
    yaml = _yaml()
    # libyaml's parser where PyYAML has it (6-10x faster than the pure Python one); either way
    # only its events are used, built into values by _YamlBuilder.
    parser = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        return _YamlBuilder(yaml, parser).document()
    except yaml.YAMLError as exc:
        raise RuleFileError(f"the file cannot be read as YAML: {exc}") from None
    finally:
        parser.dispose()


def _tag(tag: str) -> str:
    """A tag as a YAML file writes it (!!binary)."""
    return "!!" + tag[len(_TAG) :] if tag.startswith(_TAG) else _printable(tag)


class _YamlBuilder:
    """Values from a YAML parser's events, as PyYAML's safe loader builds them, except that
    what a rule file has no use for is refused on sight, before anything is expanded: aliases
    and anchors (a few hundred bytes of them make billions of values), merge keys, tags other
    than YAML's scalars, nesting past MAX_DEPTH, more than MAX_VALUES values, numbers longer
    than MAX_NUMBER, NaN and infinities."""

    def __init__(self, yaml: Any, parser: Any) -> None:
        self.events = yaml.events
        self.next_event = parser.get_event
        self.constructor = yaml.constructor.SafeConstructor()
        self.scalar_node = yaml.nodes.ScalarNode
        implicit = yaml.resolver.Resolver.yaml_implicit_resolvers
        self.everywhere = implicit.get(None, [])
        # PyYAML's implicit types by a plain scalar's first character, as Resolver.resolve
        # looks them up ('' for the empty scalar).
        self.implicit = {c: r + self.everywhere for c, r in implicit.items() if c is not None}
        self.values = 0

    def document(self) -> Any:
        events = self.events
        self.next_event()  # StreamStartEvent
        if type(self.next_event()) is events.StreamEndEvent:
            return None  # an empty file
        value = self.value(self.next_event(), 1)
        self.next_event()  # DocumentEndEvent
        event = self.next_event()
        if type(event) is not events.StreamEndEvent:
            raise self.error(event, "a rule file is one YAML document; another one starts here")
        return value

    def value(self, event: Any, depth: int) -> Any:
        events = self.events
        kind = type(event)
        if kind is events.AliasEvent:
            raise self.error(event, f"an alias (*{event.anchor}): a rule file has no aliases")
        if event.anchor is not None:
            raise self.error(event, f"an anchor (&{event.anchor}): a rule file has no anchors")
        self.values += 1
        if self.values > MAX_VALUES:
            raise self.error(event, f"the file holds more than {MAX_VALUES:,} values")
        if kind is events.ScalarEvent:
            return self.scalar(event)
        if depth > MAX_DEPTH:
            raise self.error(event, f"nested deeper than {MAX_DEPTH} levels")
        if kind is events.SequenceStartEvent:
            self.collection_tag(event, "seq")
            items = []
            event = self.next_event()
            while type(event) is not events.SequenceEndEvent:
                items.append(self.value(event, depth + 1))
                event = self.next_event()
            return items
        self.collection_tag(event, "map")
        mapping: dict[Any, Any] = {}
        event = self.next_event()
        while type(event) is not events.MappingEndEvent:
            if type(event) in (events.SequenceStartEvent, events.MappingStartEvent):
                raise self.error(event, "keys are text, not lists or mappings")
            key = self.value(event, depth + 1)
            if key in mapping:
                raise self.error(event, f"{key!r} appears twice in one mapping")
            mapping[key] = self.value(self.next_event(), depth + 1)
            event = self.next_event()
        return mapping

    def scalar(self, event: Any) -> Any:
        value: str = event.value
        tag = event.tag
        if tag is None or tag == "!":
            if not event.implicit[0]:
                return value  # quoted: text
            tag = _TAG + "str"
            for implicit_tag, pattern in self.implicit.get(value[:1], self.everywhere):
                if pattern.match(value):
                    tag = implicit_tag
                    break
        if tag == _TAG + "str":
            return value
        if tag == _TAG + "merge":
            raise self.error(event, "a merge key (<<): a rule file has no merge keys")
        if tag not in _SCALAR_TYPES:
            raise self.error(event, f"the tag {_tag(tag)} has no place in a rule file")
        if tag in (_TAG + "int", _TAG + "float"):
            problem = _number_problem(value)
            if problem:
                raise self.error(event, problem)
        try:
            built = self.constructor.yaml_constructors[tag](
                self.constructor, self.scalar_node(tag, value)
            )
        except Exception:  # PyYAML's own conversions of an explicitly tagged scalar
            raise self.error(event, f"{_show(value)} is not a {_tag(tag)}") from None
        if isinstance(built, float) and not math.isfinite(built):
            raise self.error(event, f"{value} is not a finite number")
        return built

    def collection_tag(self, event: Any, kind: str) -> None:
        if event.tag not in (None, "!", _TAG + kind):
            raise self.error(event, f"the tag {_tag(event.tag)} has no place in a rule file")

    def error(self, event: Any, problem: str) -> RuleFileError:
        mark = event.start_mark
        return RuleFileError(
            f"the file cannot be read as YAML: line {mark.line + 1}, column {mark.column + 1}: "
            f"{problem}"
        )


# An override as compared: key, limit, exempt, expires_at.
OverrideRow = tuple[str, int | None, bool, datetime | None]


@dataclass
class Plan:
    """What an import does: rules to create, to change (with the fields), to delete."""

    create: list[str] = field(default_factory=list)
    change: list[tuple[str, list[str]]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    # The created and changed rules as the file makes them, and the changed ones as they are,
    # by name: FIELDS, then groups and exempt groups (names), overrides (key, limit, exempt).
    after: dict[str, dict[str, Any]] = field(default_factory=dict)
    before: dict[str, dict[str, Any]] = field(default_factory=dict)

    def lines(self, dry_run: bool = False) -> list[str]:
        """One line per rule: ``create api``; a dry run's ``would create api``."""
        would = "would " if dry_run else ""
        out = [f"{would}create {name}" for name in self.create]
        out += [f"{would}change {name}: {', '.join(fields)}" for name, fields in self.change]
        out += [f"{would}delete {name}" for name in self.delete]
        out += [f"unchanged {name}" for name in self.unchanged]
        return out


def _clause(sentence: str) -> str:
    """``leave this empty.`` as ``leave this empty``: a sentence within a longer one."""
    return sentence[:-1] if sentence.endswith(".") and not sentence.endswith("..") else sentence


# pg_advisory_xact_lock's key for writing imports: any 64-bit number no other code takes.
IMPORT_LOCK = 0x7468725F696D7074  # "thr_impt"


def hold_rules() -> None:
    """Wait for, then hold until the transaction under way ends, the lock an import takes
    before it reads the rules when it will write: two imports applied at once run one after
    the other, and the second reads what the first wrote (its plan then differs from its
    preview's), instead of both creating one name (IntegrityError) or, on SQLite, both
    reading and then wanting to write ("database is locked")."""
    db = connections[router.db_for_write(Rule)]
    quote = db.ops.quote_name
    with db.cursor() as cursor:
        if db.vendor == "postgresql":
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [IMPORT_LOCK])
        elif db.vendor == "sqlite":
            # A write, even of no row, takes SQLite's one write lock now; the next import's
            # own waits here (the connection's timeout) until this transaction ends.
            key = Rule._meta.pk
            assert key is not None
            table, pk = quote(Rule._meta.db_table), quote(str(key.column))
            cursor.execute(f"UPDATE {table} SET {pk} = {pk} WHERE 1 = 0")
        else:
            # A row every database with the app has, locked as a row lock: the Rule's
            # content type (stable: nothing writes it).
            rule_type = ContentType.objects.get_for_model(Rule, for_concrete_model=False)
            list(ContentType.objects.select_for_update().filter(pk=rule_type.pk))


def import_rules(data: dict[str, Any], *, prune: bool, dry_run: bool) -> Plan:
    """Validate every rule as the admin does; write all of them or nothing.

    The table is read in a few queries and compared in memory: only what changed is
    written, in bulk, in one transaction, announced once. A dry run, or a file that changes
    nothing, writes nothing. A caller that may run at the same time as another import (the
    admin's apply step) calls hold_rules() first, in its transaction."""
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
            plan.after[item.rule.name] = item.after
        elif item.changed:
            plan.change.append((item.rule.name, item.changed))
            plan.after[item.rule.name] = item.after
            plan.before[item.rule.name] = item.before
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
        self.overrides: dict[int, list[OverrideRow]] = {}
        for rule_id, key, limit, exempt, expires_at in Override.objects.values_list(
            "rule_id", "key", "limit", "exempt", "expires_at"
        ):
            self.overrides.setdefault(rule_id, []).append((key, limit, exempt, expires_at))

    @staticmethod
    def _names(through: Any, names: dict[int, str]) -> dict[int, list[str]]:
        found: dict[int, list[str]] = {}
        for rule_id, group_id in through.objects.values_list("rule_id", "group_id"):
            found.setdefault(rule_id, []).append(names[group_id])
        return found

    def snapshot(self, rule: Rule) -> dict[str, Any]:
        data = {key: getattr(rule, key) for key in FIELDS}
        # A row saved before the rule kept one spelling of its networks is compared as it
        # reads, not rewritten by an import of its own export.
        with contextlib.suppress(ValueError):
            data["exempt_networks"] = canonical_networks(data["exempt_networks"])
        data["groups"] = sorted(self.members.get(rule.pk, ()))
        data["exempt_groups"] = sorted(self.exempt.get(rule.pk, ()))
        data["overrides"] = sorted(self.overrides.get(rule.pk, ()), key=_override_order)
        return data


def _override_order(item: OverrideRow) -> tuple[str, int, bool]:
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
    before: dict[str, Any]
    after: dict[str, Any]


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
        elif key == "count_statuses":
            value = _statuses_text(value)
        _check_type(name, key, value)
        setattr(rule, key, value)
    try:
        # What save() runs, as the admin does; the one unique field, the name, is how rules
        # are matched, so it needs no query.
        # (The timestamps, which save() sets, are excluded: not loaded, nothing to check.)
        rule.full_clean(exclude=["created_at", "updated_at"], validate_unique=False)
    except ValidationError as exc:
        # Each message is a sentence, and the callers add "; nothing was written." after it.
        details = "; ".join(
            f"{field}: {'; '.join(_clause(m) for m in messages)}"
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
        ((o.key, o.limit, o.exempt, o.expires_at) for o in overrides), key=_override_order
    )
    changed = [] if new else [k for k in after if after[k] != before[k]]
    return _Staged(rule, new, changed, groups, exempt_groups, overrides, before, after)


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
        _check_override(rule.name, entry)
        override = Override(
            key=entry.get("key", ""),
            limit=entry.get("limit"),
            exempt=bool(entry.get("exempt", False)),
            expires_at=_expiry(rule.name, entry),
        )
        try:
            override.full_clean(exclude=["rule"], validate_unique=False)
            if override.key in found:
                raise ValidationError(_("This client key has an override of this rule already."))
        except ValidationError as exc:
            raise RuleFileError(
                f"rule {rule.name!r}: override {entry.get('key')!r}: "
                + "; ".join(_clause(m) for m in exc.messages)
            ) from None
        found[override.key] = override
    return list(found.values())


def _check_override(rule: str, entry: Any) -> None:
    if (
        not isinstance(entry, dict)
        or set(entry) - {"key", "limit", "exempt", "expires_at"}
        or not isinstance(entry.get("key"), str)
        or type(entry.get("exempt", False)) is not bool
        or (entry.get("limit") is not None and type(entry.get("limit")) is not int)
        or not isinstance(entry.get("expires_at", ""), (str, datetime))
    ):
        raise RuleFileError(
            f"rule {rule!r}: an override is {{key: text, limit: number}} or "
            "{key: text, exempt: true}, with an optional expires_at (ISO 8601 date and time)"
        )


def _expiry(rule: str, entry: dict[str, Any]) -> datetime | None:
    """An override's end: ISO 8601 text (or a YAML timestamp); without a zone, the current one."""
    value = entry.get("expires_at")
    if value is None or value == "":
        return None
    when = value if isinstance(value, datetime) else _parsed_datetime(value)
    if when is None:
        raise RuleFileError(
            f"rule {rule!r}: override {entry.get('key')!r}: expires_at {_printable(value)!r} is "
            "not a date and time such as 2027-01-31T18:00:00+00:00"
        )
    if timezone.is_naive(when):
        when = timezone.make_aware(when)
    return when


def _parsed_datetime(text: str) -> datetime | None:
    try:
        return parse_datetime(text.strip())
    except ValueError:  # well formed, out of range (a 13th month)
        return None


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise RuleFileError(
            'YAML needs PyYAML: pip install "django-throttle-rules[yaml]", or use --format json'
        ) from None
    return yaml
