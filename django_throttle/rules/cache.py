"""The rules in force in this process: loaded and compiled once per change, refreshed when the
version token changes (read at most once per RULES_REFRESH).

Matching a request never touches the database: the enabled rules are loaded when
their version changes, compiled (regexes, methods, periods, key functions) and
indexed by scope form.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Count, Max
from redis.exceptions import ConnectionError

from ..compiled import compile_rule, with_overrides
from ..conf import conf
from ..models import Rule
from ..store import get_store
from ..store.fallback import breaker, node_open
from .ruleset import RuleSet

logger = logging.getLogger("django_throttle")

VERSION_KEY_TTL = 30 * 86400  # an expired version only costs every process one reload


# -- where the rules version lives --------------------------------------------


class RedisVersion:
    """A random token in Redis, replaced whenever any process changes a rule."""

    def __init__(self) -> None:
        self.key = f"{conf.KEY_PREFIX}:rules:version"

    def _client(self) -> Any:
        # The store's client, with the decision timeouts rather than the cache's (seconds, or
        # none): a hung server must not hold a request at every refresh.
        return get_store().client  # type: ignore[attr-defined]

    def read(self) -> Any:
        # The store (on a cluster: this key's master) failed moments ago: keep the rules,
        # don't wait on it.
        if breaker.is_open() or node_open(get_store(), self.key):
            raise ConnectionError("the store is unavailable (circuit breaker open)")
        return self._client().get(self.key)

    def bump(self) -> None:
        self._client().set(self.key, uuid.uuid4().hex, ex=VERSION_KEY_TTL)


class DatabaseVersion:
    """Without Redis, a cheap fingerprint of the rule table stands in for the version."""

    def read(self) -> Any:
        row = Rule.objects.aggregate(n=Count("pk"), last=Max("updated_at"))
        return (row["n"], row["last"])

    def bump(self) -> None:
        """Nothing to do: every write changes the row count or the latest updated_at."""


def load_rules() -> RuleSet:
    """Read and compile the enabled rules; a rule that cannot be compiled is skipped and logged."""
    compiled = []
    rows = Rule.objects.filter(enabled=True).order_by("pk")
    for rule in rows.prefetch_related("overrides", "groups", "exempt_groups"):
        try:
            overrides = [(o.key, o.limit, o.exempt) for o in rule.overrides.all()]
            groups = [g.pk for g in rule.groups.all()]
            exempt_groups = [g.pk for g in rule.exempt_groups.all()]
            ready, skipped = with_overrides(compile_rule(rule, groups, exempt_groups), overrides)
            compiled.append(ready)
            for problem in skipped:
                logger.error(
                    "django_throttle: an override of rule %r cannot be used and is skipped (%s)",
                    rule.name,
                    problem,
                )
        except Exception:
            logger.exception(
                "django_throttle: rule %r cannot be enforced and is skipped", rule.name
            )
    return RuleSet(compiled, block_cache=conf.BLOCK_CACHE)


_READ_VERSION = "read the rules version"
_LOAD = "load rules from the database"


class RuleCache:
    """The process's current RuleSet, re-read when the version changes (checked every RULES_REFRESH)."""

    def __init__(
        self,
        version: RedisVersion | DatabaseVersion,
        loader: Callable[[], RuleSet] = load_rules,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.version = version
        self._loader = loader
        self._clock = clock
        self._lock = threading.Lock()
        self._rules: RuleSet | None = None
        self._seen_version: Any = None
        self._next_check = 0.0
        self._stale = False  # this process changed a rule: reload whatever the version says
        self._invalidated = False  # ... while a reload was running
        self._failing: str | None = None
        self.bump_pending = False

    def get(self) -> RuleSet:
        rules = self._rules
        if rules is not None and self._clock() < self._next_check:
            return rules
        # One thread refreshes; the others wait for it rather than decide on rules that may
        # be stale: once RULES_REFRESH has passed after a change, no thread serves the old
        # rules. (The wait is one version read, once per RULES_REFRESH.)
        self._lock.acquire()
        try:
            if self._rules is None or self._clock() >= self._next_check:
                self._invalidated = False
                try:
                    self._refresh()
                finally:
                    # Only now: a thread arriving during the reload must wait for it, not
                    # see a next check in the future and go on with the old rules.
                    # ...and a change this process made meanwhile is loaded at the next request.
                    self._next_check = (
                        0.0 if self._invalidated else self._clock() + conf.RULES_REFRESH
                    )
        finally:
            self._lock.release()
        return self._rules if self._rules is not None else RuleSet()

    def _refresh(self) -> None:
        if self.bump_pending:
            self.announce()
        try:
            version = self.version.read()
        except Exception as exc:
            self._report(_READ_VERSION, exc)
            version = self._seen_version if self._rules is not None else object()
        else:
            if self._failing == _READ_VERSION:
                logger.warning("django_throttle: the rules version can be read again")
                self._failing = None
        if self._rules is not None and not self._stale and version == self._seen_version:
            return
        self._stale = False  # before loading, so an invalidate() during the load is not lost
        try:
            rules = self._loader()
        except DatabaseError as exc:
            self._stale = True
            self._report(_LOAD, exc)
            if self._rules is None:
                # No rules yet: run without any until the next refresh retries, rather
                # than query the database on every request.
                self._rules = RuleSet()
            return
        self._rules, self._seen_version = rules, version
        if self._failing == _LOAD:
            logger.warning("django_throttle: rules loaded again after the error")
            self._failing = None

    def _report(self, what: str, exc: Exception) -> None:
        # Logged once per outage, not once per refresh or per request.
        if self._failing != what:
            self._failing = what
            logger.error(
                "django_throttle: could not %s (%s); the rules in force stay as they are", what, exc
            )

    def announce(self) -> None:
        """Tell the other processes that the rules changed; retried at each refresh until it works."""
        try:
            self.version.bump()
        except Exception as exc:
            if not self.bump_pending:
                logger.error(
                    "django_throttle: could not announce a rule change to other processes (%s); "
                    "retrying at each refresh",
                    exc,
                )
            self.bump_pending = True
        else:
            self.bump_pending = False

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


_cache: RuleCache | None = None
_cache_lock = threading.Lock()


def rule_cache() -> RuleCache:
    global _cache
    cache = _cache
    if cache is None:
        with _cache_lock:
            if _cache is None:
                _cache = RuleCache(RedisVersion() if conf.uses_redis else DatabaseVersion())
            cache = _cache
    return cache


def get_rules() -> RuleSet:
    """The rules in force in this process."""
    return rule_cache().get()


def reset_rule_cache() -> None:
    """Forget the cached rules and how their version is kept (settings changed)."""
    global _cache
    with _cache_lock:
        _cache = None


def clients_reset() -> None:
    """A client's state was reset: every process forgets the rejections it remembers (the
    block cache) within RULES_REFRESH, as for a rule change, and this process at once."""
    cache = rule_cache()
    cache.invalidate()
    cache.announce()


def rules_changed() -> None:
    """A rule was written: once the transaction commits (at once in autocommit), this process
    reloads at its next request and the others within RULES_REFRESH. Nothing happens on a
    rollback."""
    cache = rule_cache()

    def committed() -> None:
        cache.invalidate()
        cache.announce()

    transaction.on_commit(committed)
