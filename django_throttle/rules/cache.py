"""The rules in force in this process, reloaded when the rules version changes and checked at
most once per RULES_REFRESH (docs/internals.md, "The rules in each process")."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, cast

from django.db import DatabaseError, connection, connections, transaction
from django.db.models import Count, Max
from django.utils import timezone

from ..choices import KeyKind
from ..compiled import CompiledRule, OverrideSpec, RuleRow, compile_rule, with_overrides
from ..conf import conf
from ..models import Ban, Override, Rule
from ..runtime import current, runtime
from ..state_keys import held_key, same_slot, version_key
from ..store import get_store
from .bans import BanIndex
from .ruleset import RuleSet

logger = logging.getLogger("django_throttle")

VERSION_KEY_TTL = 30 * 86400  # an expired version only costs every process one reload


# -- where the rules version lives --------------------------------------------


class RedisVersion:
    """A random token in Redis, replaced whenever any process changes a rule; and the blocks
    token, replaced whenever a client's state is reset or refunded."""

    def __init__(self) -> None:
        self.key = version_key()
        self.blocks_key = same_slot(self.key, "blocks")
        self.held_key = held_key()

    def read(self) -> Any:
        return self.read_tokens()[0]

    def read_tokens(self) -> tuple[Any, Any]:
        """The rules version and the blocks token, in one round trip."""
        # The store (on a cluster: these keys' master) failed moments ago: keep the rules,
        # don't wait on it (ConnectionError).
        # The held key tells the store whether to read every rule's block keys.
        return get_store().read_tokens(self.key, self.blocks_key, self.held_key)

    def bump(self) -> None:
        get_store().write_token(self.key, uuid.uuid4().hex, VERSION_KEY_TTL)

    def bump_blocks(self) -> None:
        # Retried at the next refresh rather than waited on now.
        get_store().write_token(
            self.blocks_key, uuid.uuid4().hex, VERSION_KEY_TTL, unless_open=True
        )


class DatabaseVersion:
    """Without Redis, a cheap fingerprint of the rule and ban tables stands in for the version."""

    def read(self) -> Any:
        row = Rule.objects.aggregate(n=Count("pk"), last=Max("updated_at"))
        bans = Ban.objects.aggregate(n=Count("pk"), last=Max("updated_at"))
        return (row["n"], row["last"], bans["n"], bans["last"])

    def read_tokens(self) -> tuple[Any, Any]:
        """The fingerprint, and no blocks token: without Redis, state is this process's own."""
        return self.read(), None

    def bump(self) -> None:
        """Nothing to do: every write changes a row count or a latest updated_at."""

    def bump_blocks(self) -> None:
        """Nothing to do: the memory store's clients are this process's only."""


# What a rule does: its columns but its name, whether it is enabled and its dates, in the
# order a rule file writes them (management/rulefiles.py).
RULE_SETTINGS = (
    "scope",
    "methods",
    "count_statuses",
    "cost_header",
    "key_kind",
    "key_arg",
    "limit",
    "per",
    "unit",
    "algorithm",
    "burst",
    "block_seconds",
    "block_growth",
    "action",
    "fail_mode",
    "applies_to",
    "exempt_staff",
    "exempt_networks",
)
# The columns compile_rule reads, in the order of _Row's slots ("id": the primary key).
_COLUMNS = ("id", "name", *RULE_SETTINGS)


class _Row:
    """A Rule's columns as compile_rule reads them, without building a model instance."""

    __slots__ = ("pk", *_COLUMNS[1:])  # what compiled.RuleRow declares

    def __init__(self, values: tuple[Any, ...]) -> None:
        for name, value in zip(self.__slots__, values, strict=True):
            setattr(self, name, value)


def load_rules(previous: RuleSet | None = None) -> RuleSet:
    """Read and compile the enabled rules; a rule that cannot be compiled is skipped and logged.
    A row identical to one of ``previous`` (with its overrides and groups) keeps its compiled
    rule: a reload compiles only what changed. The bans in force are indexed with them."""
    # Five flat queries, whatever the number of rules (no IN list of every primary key).
    overrides: dict[int, list[OverrideSpec]] = {}
    now = timezone.now()
    for rule_id, key, limit, exempt, expires_at in (
        Override.objects.filter(rule__enabled=True)
        .exclude(expires_at__lte=now)  # ended already; those ending later, rule_for() drops
        .order_by("rule_id", "key")
        .values_list("rule_id", "key", "limit", "exempt", "expires_at")
    ):
        ends = None if expires_at is None else expires_at.timestamp()
        overrides.setdefault(rule_id, []).append((key, limit, exempt, ends))
    groups = _group_ids(Rule.groups.through)
    exempt_groups = _group_ids(Rule.exempt_groups.through)
    known = previous.sources if previous is not None else {}
    sources: dict[int, tuple[object, CompiledRule]] = {}
    compiled = []
    rows = Rule.objects.filter(enabled=True).order_by("pk").values_list(*_COLUMNS)
    for values in rows:
        pk = values[0]
        mine = overrides.get(pk, ())
        source = (values, tuple(mine), groups.get(pk, ()), exempt_groups.get(pk, ()))
        seen = known.get(pk)
        if seen is not None and seen[0] == source:
            sources[pk] = seen
            compiled.append(seen[1])
            continue
        row = cast(RuleRow, _Row(values))
        try:
            rule = compile_rule(row, source[2], source[3])
            ready, skipped = with_overrides(rule, mine)
            for problem in skipped:
                logger.error(
                    "django_throttle: an override of rule %r cannot be used and is skipped (%s)",
                    row.name,
                    problem,
                )
        except Exception:
            logger.exception("django_throttle: rule %r cannot be enforced and is skipped", row.name)
            continue
        sources[pk] = (source, ready)
        compiled.append(ready)
    ruleset = RuleSet(compiled, block_cache=conf.BLOCK_CACHE, bans=load_bans(compiled))
    ruleset.sources = sources
    return ruleset


def load_bans(rules: Iterable[CompiledRule]) -> BanIndex | None:
    """The bans not ended yet, indexed (None: there are none); a header or param ban is
    looked for under the header and parameter names these rules key on."""
    now = timezone.now()
    rows = [
        (key, None if ends is None else ends.timestamp())
        for key, ends in Ban.objects.exclude(expires_at__lte=now).values_list("key", "expires_at")
    ]
    if not rows:
        return None
    rules = tuple(rules)
    return BanIndex(
        rows,
        header_keys=(r.header_meta_key for r in rules if r.key_kind == KeyKind.HEADER),
        params=(r.key_arg for r in rules if r.key_kind == KeyKind.PARAM),
        ipv6_prefix=conf.IPV6_PREFIX,
        now=now.timestamp(),
    )


def _group_ids(through: Any) -> dict[int, tuple[int, ...]]:
    """Rule id -> the ids of its groups in this many-to-many table, sorted."""
    found: dict[int, list[int]] = {}
    for rule_id, group_id in through.objects.order_by("rule_id", "group_id").values_list(
        "rule_id", "group_id"
    ):
        found.setdefault(rule_id, []).append(group_id)
    return {rule_id: tuple(ids) for rule_id, ids in found.items()}


_READ_VERSION = "read the rules version"
_CURRENT = object()  # _check(): the rules in force are current
_LOAD = "load rules from the database"


class RuleCache:
    """The process's current RuleSet, re-read when the version changes (checked every
    RULES_REFRESH); its block cache emptied when the blocks token changes."""

    def __init__(
        self,
        version: RedisVersion | DatabaseVersion | None = None,
        loader: Callable[[RuleSet | None], RuleSet] = load_rules,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # The runtime's part (no argument) keeps its version where the settings say.
        if version is None:
            version = RedisVersion() if conf.uses_redis else DatabaseVersion()
        self.version = version
        self._loader = loader
        self._clock = clock
        self._lock = threading.Lock()
        self._rules: RuleSet | None = None
        self._seen_version: Any = None
        self._seen_blocks: Any = None
        self._next_check = 0.0
        self._stale = False  # this process changed a rule: reload whatever the version says
        # The last load failed: the next refresh loads again whatever the version says, but
        # (unlike a change made here) requests need not wait for it.
        self._load_failed = False
        self._invalidated = False  # ... while a reload was running
        self._failing: str | None = None
        self.bump_pending = False
        self.blocks_pending = False
        self._reloading = False  # a thread of its own is loading changed rules

    def get(self) -> RuleSet:
        rules = self._rules
        now = self._clock()
        if rules is not None and now < self._next_check:
            return rules
        # One thread refreshes: it reads the version (and the blocks token). If the rules in
        # force are at most a quarter of RULES_REFRESH overdue (a busy process), a reload it
        # finds needed runs in a thread of its own, and until it is done every request is
        # decided on them, as they were moments ago. Otherwise (a process idle since before
        # the change), after a change made in this process, and before the first load,
        # requests wait for the load: a change is in force within RULES_REFRESH, plus the
        # time a reload takes, and no request is decided on rules older than that.
        if rules is not None and not self._stale:
            grace = now < self._next_check + conf.RULES_REFRESH / 4
            if self._lock.acquire(blocking=False):
                return self._refreshed(in_background=grace)
            if grace or self._reloading:
                return rules
        self._lock.acquire()
        return self._refreshed(in_background=False)

    def _refreshed(self, in_background: bool) -> RuleSet:
        """Refresh if still due (the lock is held; released here, or by the thread that
        reloads in the background), and the rules in force."""
        handed_over = False
        try:
            if self._rules is None or self._clock() >= self._next_check:
                self._invalidated = False
                try:
                    version = self._check()
                    if version is not _CURRENT:
                        # In a transaction (a test's), only this thread sees its writes.
                        if in_background and not connection.in_atomic_block:
                            self._reloading = True
                            try:
                                threading.Thread(
                                    target=self._load_in_background,
                                    args=(version,),
                                    name="django_throttle rules reload",
                                    daemon=True,
                                ).start()
                            except BaseException:
                                self._reloading = False
                                raise
                            handed_over = True
                        else:
                            self._load(version)
                finally:
                    if not handed_over:
                        self._checked()
        finally:
            if not handed_over:
                self._lock.release()
        return self._rules if self._rules is not None else RuleSet()

    def _checked(self) -> None:
        # Only now: a thread arriving during the reload must wait for it (or, in the grace,
        # go on with the old rules), not see a next check in the future. A change this
        # process made meanwhile is loaded at the next request.
        self._next_check = 0.0 if self._invalidated else self._clock() + conf.RULES_REFRESH

    def _load_in_background(self, version: Any) -> None:
        try:
            self._load(version)
        except Exception:
            # No request to raise it to: the rules in force stay, the next refresh retries.
            self._load_failed = True
            logger.exception("django_throttle: the rules could not be reloaded")
        finally:
            self._checked()
            self._reloading = False
            self._lock.release()
            connections.close_all()  # this thread's own, opened for the load

    def _check(self) -> Any:
        """Read the tokens: empty the block cache if the blocks token changed; the version
        to load, or _CURRENT if the rules in force are current."""
        if self.bump_pending:
            self.announce()
        if self.blocks_pending:
            self.announce_blocks()
        try:
            version, blocks = self.version.read_tokens()
        except Exception as exc:
            self._report(_READ_VERSION, exc)
            version = self._seen_version if self._rules is not None else object()
            blocks = self._seen_blocks
        else:
            if self._failing == _READ_VERSION:
                logger.warning("django_throttle: the rules version can be read again")
                self._failing = None
        if blocks != self._seen_blocks:
            # A client was reset or refunded somewhere: what this process remembers of
            # rejections may no longer hold. The rules stay.
            self._seen_blocks = blocks
            if self._rules is not None and self._rules.blocked:
                self._rules.blocked.clear()
        if (
            self._rules is not None
            and not self._stale
            and not self._load_failed
            and version == self._seen_version
        ):
            return _CURRENT
        return version

    def _load(self, version: Any) -> None:
        self._stale = False  # before loading, so an invalidate() during the load is not lost
        self._load_failed = False
        previous = self._rules
        try:
            rules = self._loader(previous)
        except DatabaseError as exc:
            self._load_failed = True
            self._report(_LOAD, exc)
            if self._rules is None:
                # No rules yet: run without any until the next refresh retries, rather
                # than query the database on every request.
                self._rules = RuleSet()
            return
        if previous is not None:
            _carry_blocks(previous, rules)
        if self._failing == _LOAD:
            # Said before the rules are put in force: whoever sees them sees the recovery logged.
            logger.warning("django_throttle: rules loaded again after the error")
            self._failing = None
        self._rules, self._seen_version = rules, version

    def _report(self, what: str, exc: Exception) -> None:
        # Logged once per outage, not once per refresh or per request.
        if self._failing != what:
            self._failing = what
            logger.error(
                "django_throttle: could not %s (%s); the rules in force stay as they are", what, exc
            )

    def announce(self) -> None:
        """Tell the other processes that the rules changed; retried at each refresh until it works."""
        self.bump_pending = _announced(self.version.bump, self.bump_pending, "a rule change")

    def announce_blocks(self) -> None:
        """Tell the other processes to forget the rejections they remember; retried at each
        refresh until it works."""
        self.blocks_pending = _announced(self.version.bump_blocks, self.blocks_pending, "a reset")

    def forget(self, state_keys: Iterable[str]) -> None:
        """Drop these clients (state prefix + identity) from this process's block cache."""
        rules = self._rules
        blocked = rules.blocked if rules is not None else None
        if blocked:
            for key in state_keys:
                blocked.pop(key, None)

    def fresh(self) -> RuleSet | None:
        """The rules in force if no refresh is due (one would read the version, and maybe the
        database), else None."""
        rules = self._rules
        if rules is not None and self._clock() < self._next_check:
            return rules
        return None

    def current(self) -> RuleSet | None:
        """The rules in force now, without a refresh (which may read the database); None
        before they are first loaded."""
        return self._rules

    def invalidate(self) -> None:
        """Re-read the rules at the next request of this process."""
        self._next_check = 0.0
        self._stale = True
        self._invalidated = True


def _carry_blocks(old: RuleSet, new: RuleSet) -> None:
    """Keep the remembered rejections of the rules a reload did not change (the same compiled
    rule: same row, overrides and groups) and of code defaults; drop the others'."""
    if not old.blocked or new.blocked is None:
        return
    before = {rule.state_prefix: rule for rule in old.rules}
    after = {rule.state_prefix: rule for rule in new.rules}
    for key, entry in list(old.blocked.items()):
        prefix = entry[1].rule.state_prefix
        rule = before.get(prefix)
        if rule is None or after.get(prefix) is rule:
            new.blocked[key] = entry


def _announced(bump: Callable[[], None], pending: bool, what: str) -> bool:
    """Call ``bump``; whether the announcement of ``what`` is still pending (an error is
    logged once, not at each retry)."""
    try:
        bump()
    except Exception as exc:
        if not pending:
            logger.error(
                "django_throttle: could not announce %s to other processes (%s); "
                "retrying at each refresh",
                what,
                exc,
            )
        return True
    return False


def rule_cache() -> RuleCache:
    """The process's rule cache (the runtime's)."""
    return runtime().part(RuleCache)


def get_rules() -> RuleSet:
    """The rules in force in this process."""
    return current.runtime.part(RuleCache).get()


def clients_reset(state_keys: Iterable[str] = (), announce: bool = True) -> None:
    """Clients' state was reset or given back (``state_keys``: state prefix + identity each):
    this process forgets their remembered rejections at once, every other process forgets
    what it remembers within RULES_REFRESH (the blocks token; with ``announce`` False, within
    twice that: this process replaces the token at its next refresh). No rule is reloaded."""
    cache = rule_cache()
    cache.forget(state_keys)
    if not conf.BLOCK_CACHE:
        return
    if announce:
        cache.announce_blocks()
    else:
        cache.blocks_pending = True


def rules_changed() -> None:
    """A rule was written: once the transaction commits (at once in autocommit), this process
    reloads at its next request and the others within RULES_REFRESH. Nothing happens on a
    rollback."""
    cache = rule_cache()

    def committed() -> None:
        cache.invalidate()
        cache.announce()

    transaction.on_commit(committed)
