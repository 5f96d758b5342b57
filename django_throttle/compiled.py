"""``CompiledRule``: a rule ready for the hot path, built from a Rule row or from code."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from django.utils.module_loading import import_string

from .calendar_windows import CalendarWindows
from .choices import ALGORITHMS_WITH_BURST, Action, Algorithm, AppliesTo, FailMode, KeyKind, Unit
from .conf import conf
from .networks import NO_NETWORKS, NetworkSet, network_set
from .patterns import Matcher, compile_scope
from .rates import CALENDAR_UNITS, MAX_PER, MAX_WINDOW, UNIT_SECONDS
from .state_keys import ALGORITHM_CODES, OUTCOMES_MARK, base36, block_prefix, state_prefix
from .statuses import parse_statuses

MAX_LIMIT = 1_000_000_000

# Whether the async path may gather a rule on the event loop, where the database must not be
# used: always, once the request's user is loaded, or never (its key function, its groups).
ON_LOOP, WITH_USER, IN_THREAD = 2, 1, 0
MAX_BLOCK = 366 * 86400  # a year
MAX_GROWTH = 1000  # a block growth factor
GROWN_BLOCK_CAP = 7 * 86400  # a growing block lasts at most a week (or its first block)
# A concurrency slot is given back when its response ends, whatever the status: a status it
# does not count would change nothing.
CONCURRENCY_COUNTS_ALL = "a concurrency rule counts every request in flight, whatever its status"

KeyFunction = Callable[[Any], "str | None"]

# Django's Choices.values builds a new list at each access: a load of 10,000 rules took
# a third of its time there.
_AUDIENCES = frozenset(AppliesTo.values)
_ACTIONS = frozenset(Action.values)
_FAIL_MODES = frozenset(FailMode.values)
_KEY_KINDS = frozenset(KeyKind.values)
_UNITS = frozenset(Unit.values)


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """Everything derivable from a rule is computed once, here."""

    id: int  # the Rule's primary key; 0 for a code default
    name: str
    scope: str
    methods: frozenset[str] | None
    key_kind: str
    key_arg: str
    key_function: KeyFunction | None
    limit: int
    period: int  # seconds (of a calendar window: its nominal length)
    algorithm: str
    burst: int
    action: str
    fail_mode: str
    state_prefix: str  # where this rule's per-client state lives in the store; unique per rule
    block_prefix: str  # where its blocks of clients live: the rule's id and name, not algorithm
    header_meta_key: str = ""  # request.META name of the header a 'header' rule keys on
    match: Matcher | None = None  # a regular-expression scope's matcher (patterns.py)
    block: int = 0  # seconds a rejection blocks the client for
    # Each further block of a client remembered from its last (BLOCK_MEMORY) lasts this many
    # times the one before, up to GROWN_BLOCK_CAP.
    block_growth: int = 1
    calendar: CalendarWindows | None = None  # a week or month window's starts, in TIME_ZONE
    on_loop: int = ON_LOOP  # see ON_LOOP, WITH_USER, IN_THREAD
    # The response statuses that count (count_statuses, classes spelled out); None: every one.
    # What a request took is given back once its response has another status.
    count_statuses: frozenset[int] | None = None
    # The response header holding a request's actual cost (Rule.cost_header): "" for none.
    cost_header: str = ""
    # Who the rule counts (audience.py); all of it is known once the rules are loaded.
    audience: str = AppliesTo.ALL  # the row's applies_to
    groups: frozenset[int] = frozenset()
    exempt_staff: bool = False
    exempt_groups: frozenset[int] = frozenset()
    exempt_networks: NetworkSet = NO_NETWORKS
    # Identity -> the rule as it applies to that client (its own limit), or None: exempt.
    overrides: Mapping[str, CompiledRule | None] | None = field(
        default=None, compare=False, repr=False
    )
    # Identity -> when its override stops applying (Unix seconds), for those that end.
    override_ends: Mapping[str, float] | None = field(default=None, compare=False, repr=False)
    # The store's own cache of this rule's part of a store call, made at first use (store/).
    store_args: Any = field(init=False, compare=False, repr=False)
    # Whether a rejection by this rule rejects the request (a log-only rule never does).
    enforcing: bool = field(init=False, compare=False, repr=False)
    # Whether it counts every client (no audience, no exemption of its own): then only the
    # EXEMPT_NETWORKS setting can leave a request out (audience.counts()).
    everyone: bool = field(init=False, compare=False, repr=False)
    # A block duration with count_statuses: a decision never starts the block (a rejection
    # may come from shares of requests in flight whose outcome is unknown); a counted
    # outcome that fills the limit does (outcomes_rule()).
    defers_block: bool = field(init=False, compare=False, repr=False)
    # The rule's variants made from it, at first use (every_call(), outcomes_rule()).
    variants: dict[str, CompiledRule] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Here, not in build_rule: an override's replace() with its own limit gets its own.
        for name, value in (
            ("enforcing", self.action != Action.LOG),
            (
                "everyone",
                self.audience == AppliesTo.ALL
                and not (self.exempt_staff or self.exempt_groups or self.exempt_networks),
            ),
            ("store_args", None),
            ("defers_block", bool(self.block and self.count_statuses)),
            ("variants", {}),
        ):
            object.__setattr__(self, name, value)

    def applies_to(self, method: str) -> bool:
        return self.methods is None or method in self.methods

    def fails_closed(self, fail_open: bool) -> bool:
        """Whether this rule answers 503 while the store is unreachable."""
        mode = self.fail_mode
        return mode == FailMode.CLOSED or (mode == FailMode.DEFAULT and not fail_open)


def every_call(rule: CompiledRule) -> CompiledRule:
    """The rule counting every call, where no response will be seen to count by
    (``check_key()``, ``acquire()``, a bare ``check()``): every call is a counted outcome, so
    its rejection starts the block."""
    if not rule.defers_block:
        return rule
    found = rule.variants.get("every")
    if found is None:
        found = rule.variants["every"] = replace(rule, count_statuses=None)
    return found


def outcomes_rule(rule: CompiledRule) -> CompiledRule:
    """The state of a deferring rule's counted outcomes (``defers_block``), one short of the
    rule: a counted outcome is decided against it when its response is known, and rejected
    there exactly when, with it, the rule has no room for one more request, which starts the
    rule's block (the same block key). Its state lives beside the rule's: ``thr:12fo:``."""
    found = rule.variants.get("outcomes")
    if found is None:
        # A bucket keeps its rate and has one place less; a window or log, one request less.
        bucket = rule.algorithm in ALGORITHMS_WITH_BURST
        found = rule.variants["outcomes"] = replace(
            rule,
            state_prefix=rule.state_prefix[:-1] + OUTCOMES_MARK + ":",
            count_statuses=None,
            overrides=None,
            override_ends=None,
            limit=rule.limit if bucket else rule.limit - 1,
            burst=rule.burst - 1,
        )
    return found


def build_rule(
    *,
    id: int,
    name: str,
    algorithm: str,
    limit: int,
    period: int,
    burst: int | None = None,
    action: str = Action.REJECT,
    scope: str = "*",
    key_kind: str = KeyKind.IP,
    key_arg: str = "",
    methods: frozenset[str] | None = None,
    fail_mode: str = FailMode.DEFAULT,
    key_function: KeyFunction | None = None,
    rule_key: str | None = None,
    block: int = 0,
    block_growth: int = 1,
    applies_to: str = AppliesTo.ALL,
    groups: frozenset[int] = frozenset(),
    exempt_staff: bool = False,
    exempt_groups: frozenset[int] = frozenset(),
    exempt_networks: NetworkSet = NO_NETWORKS,
    calendar: CalendarWindows | None = None,
    count_statuses: frozenset[int] | None = None,
    cost_header: str = "",
) -> CompiledRule:
    """The one constructor of compiled rules; ``rule_key`` names the state in the store
    (default: the primary key in base 36). Raises ValueError for values no rule can have,
    however they reached it (a row written with SQL, a code default)."""
    _check_values(algorithm, limit, period, burst, action, fail_mode, key_kind)
    _check_whole("block", block, 0, MAX_BLOCK)
    _check_whole("block_growth", block_growth, 1, MAX_GROWTH)
    if calendar is not None and algorithm != Algorithm.FIXED_WINDOW:
        raise ValueError("week and month windows are counted by the fixed window only")
    if applies_to not in _AUDIENCES:
        raise ValueError(f"unknown audience {applies_to!r}")
    if count_statuses and algorithm == Algorithm.CONCURRENCY:
        raise ValueError(CONCURRENCY_COUNTS_ALL)
    if cost_header and algorithm == Algorithm.CONCURRENCY:
        raise ValueError("a concurrency rule counts requests in flight, not costs")
    if methods and "GET" in methods:
        # Django answers HEAD with the GET view: a rule for GET that let HEAD through
        # uncounted would let anyone run the view without limit.
        methods = methods | {"HEAD"}
    return CompiledRule(
        id=id,
        name=name,
        scope=scope,
        methods=methods or None,
        key_kind=key_kind,
        key_arg=key_arg,
        key_function=key_function,
        limit=limit,
        period=period,
        algorithm=algorithm,
        burst=burst or limit,
        action=action,
        fail_mode=fail_mode,
        state_prefix=state_prefix(base36(id) if rule_key is None else rule_key, algorithm),
        block_prefix=block_prefix(base36(id) if rule_key is None else rule_key, name),
        header_meta_key=header_meta_key(key_arg) if key_kind == KeyKind.HEADER else "",
        match=compile_scope(scope) if scope.startswith("^") else None,
        block=block,
        block_growth=block_growth if block else 1,
        audience=applies_to,
        groups=groups,
        exempt_staff=exempt_staff,
        exempt_groups=exempt_groups,
        exempt_networks=exempt_networks,
        calendar=calendar,
        on_loop=_on_loop(key_kind, applies_to, groups, exempt_staff, exempt_groups),
        count_statuses=count_statuses or None,
        cost_header=cost_header,
    )


def _on_loop(
    key_kind: str,
    applies_to: str,
    groups: frozenset[int],
    exempt_staff: bool,
    exempt_groups: frozenset[int],
) -> int:
    if key_kind == KeyKind.CUSTOM or applies_to == AppliesTo.GROUPS or groups or exempt_groups:
        return IN_THREAD  # a key function may query; a user's groups are read from the database
    if key_kind in (KeyKind.USER, KeyKind.USER_OR_IP) or applies_to != AppliesTo.ALL:
        return WITH_USER
    return WITH_USER if exempt_staff else ON_LOOP


# An override as with_overrides() takes it: key, limit, exempt, and optionally when it stops
# applying (Unix seconds; None: never).
OverrideSpec = tuple[str, int | None, bool] | tuple[str, int | None, bool, float | None]


def with_overrides(
    rule: CompiledRule, overrides: Iterable[OverrideSpec]
) -> tuple[CompiledRule, list[str]]:
    """The rule with its overrides, (key, limit, exempt[, ends]) each, and why any was skipped
    (an override that cannot be used never takes its rule down). A client's own limit keeps
    the rule's state (the same key): only the limit the state is compared with changes."""
    table: dict[str, CompiledRule | None] = {}
    ends: dict[str, float] = {}
    skipped = []
    for spec in overrides:
        key, limit, exempt = spec[0], spec[1], spec[2]
        end = spec[3] if len(spec) > 3 else None
        if end is not None:
            ends[key] = end
        if exempt:
            table[key] = None
            continue
        try:
            if limit is None:
                raise ValueError("neither a limit nor exempt")
            _check_values(
                rule.algorithm, limit, rule.period, None, rule.action, rule.fail_mode, rule.key_kind
            )
        except ValueError as exc:
            skipped.append(f"{key}: {exc}")
            continue
        # A bucket's burst defaults to its limit; an explicit burst stays the rule's.
        burst = limit if rule.burst == rule.limit else rule.burst
        table[key] = replace(rule, limit=limit, burst=burst)
    if not table:
        return rule, skipped
    ends = {key: end for key, end in ends.items() if key in table}
    return replace(rule, overrides=table, override_ends=ends or None), skipped


def _check_values(
    algorithm: str,
    limit: int,
    period: int,
    burst: int | None,
    action: str,
    fail_mode: str,
    key_kind: str,
) -> None:
    if algorithm not in ALGORITHM_CODES:
        raise ValueError(f"unknown algorithm {algorithm!r}")
    _check_whole("limit", limit, 1, MAX_LIMIT)
    _check_whole("period", period, 1, MAX_LIMIT)
    if burst is not None:
        _check_whole("burst", burst, 1, MAX_LIMIT)
    if burst is not None and algorithm not in ALGORITHMS_WITH_BURST and burst != limit:
        raise ValueError(f"only token and leaky buckets have a burst, not {algorithm}")
    if action not in _ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    if action == Action.DELAY and algorithm != Algorithm.LEAKY_BUCKET:
        raise ValueError("delay works with the leaky bucket only")
    if fail_mode not in _FAIL_MODES:
        raise ValueError(f"unknown fail mode {fail_mode!r}")
    if key_kind not in _KEY_KINDS:
        raise ValueError(f"unknown key kind {key_kind!r}")


class RuleRow(Protocol):
    """What compile_rule reads of a Rule (the model lives in a layer above)."""

    pk: Any
    name: str
    scope: str
    methods: str
    key_kind: str
    key_arg: str
    limit: int
    per: int
    unit: str
    algorithm: str
    burst: int | None
    action: str
    fail_mode: str
    block_seconds: int
    block_growth: int
    applies_to: str
    exempt_staff: bool
    exempt_networks: str
    count_statuses: str
    cost_header: str


def compile_rule(
    rule: RuleRow, groups: Iterable[int] = (), exempt_groups: Iterable[int] = ()
) -> CompiledRule:
    """Compile a Rule row (and the ids of its groups, read by the caller); raise ValueError
    (or ImportError) if it cannot be enforced."""
    key_function = None
    if rule.key_kind == KeyKind.CUSTOM:
        path = conf.KEY_FUNCTIONS.get(rule.key_arg)
        if path is None:
            raise ValueError(f"key function {rule.key_arg!r} is not in KEY_FUNCTIONS")
        key_function = import_string(path)
    methods = frozenset(m.strip() for m in rule.methods.upper().split(",") if m.strip())
    return build_rule(
        id=rule.pk,
        name=rule.name,
        scope=rule.scope,
        methods=methods,
        key_kind=rule.key_kind,
        key_arg=rule.key_arg,
        key_function=key_function,
        limit=rule.limit,
        period=_period(rule.per, rule.unit),
        algorithm=rule.algorithm,
        burst=rule.burst,
        action=rule.action,
        fail_mode=rule.fail_mode,
        block=rule.block_seconds,
        block_growth=rule.block_growth,
        applies_to=rule.applies_to,
        groups=frozenset(groups),
        exempt_staff=rule.exempt_staff,
        exempt_groups=frozenset(exempt_groups),
        exempt_networks=network_set(rule.exempt_networks, conf.IPV6_PREFIX),
        calendar=calendar_of(rule.per, rule.unit),
        count_statuses=parse_statuses(rule.count_statuses),
        cost_header=rule.cost_header,
    )


def _check_whole(name: str, value: object, low: int, high: int) -> None:
    """A row written around validation may hold anything: only a whole number in range."""
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {high}, not {value!r}")


def _period(per: int, unit: str) -> int:
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {unit!r}")
    _check_whole("per", per, 1, MAX_PER)
    if per * UNIT_SECONDS[unit] > MAX_WINDOW:
        raise ValueError(f"a window can last at most {MAX_WINDOW // 86400} days")
    return per * UNIT_SECONDS[unit]


def calendar_of(per: int, unit: str) -> CalendarWindows | None:
    """The calendar windows of a week or month rule in TIME_ZONE, None for other units."""
    return CalendarWindows(unit, per, conf.TIME_ZONE) if unit in CALENDAR_UNITS else None


def header_meta_key(header: str) -> str:
    """Where WSGI and ASGI put a header in request.META: X-Api-Key is HTTP_X_API_KEY."""
    name = header.upper().replace("-", "_")
    return name if name in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + name
