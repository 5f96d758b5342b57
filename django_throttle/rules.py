"""Rules compiled and indexed once per change, cached per process, refreshed on a version bump.

Matching a request never touches the database: the enabled rules are loaded
when their version changes, compiled (regexes, methods, periods, key
functions) and indexed by scope form, so a request only looks at the rules
that can apply to it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, transaction
from django.utils.module_loading import import_string

from .conf import conf
from .rates import UNIT_SECONDS

logger = logging.getLogger("django_throttle")

VERSION_KEY_TTL = 30 * 86400  # an expired version only costs every process one reload


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A rule ready for the hot path: everything derivable is computed here."""

    id: int
    name: str
    scope: str
    methods: frozenset[str] | None
    key_kind: str
    key_arg: str
    key_function: Callable[[Any], str | None] | None
    limit: int
    period: int
    algorithm: str
    burst: int
    action: str
    fail_mode: str
    state_prefix: str  # where this rule's per-client state lives in the store
    header_meta_key: str = ""  # request.META name of the header a 'header' rule keys on

    def applies_to(self, method: str) -> bool:
        return self.methods is None or method in self.methods


def compile_rule(rule: Any) -> CompiledRule:
    """Compile a Rule row; raise ValueError (or ImportError) if it cannot be enforced."""
    key_function = None
    if rule.key_kind == "custom":
        path = conf.KEY_FUNCTIONS.get(rule.key_arg)
        if path is None:
            raise ValueError(f"key function {rule.key_arg!r} is not in KEY_FUNCTIONS")
        key_function = import_string(path)
    methods = frozenset(m.strip() for m in rule.methods.upper().split(",") if m.strip())
    return CompiledRule(
        id=rule.pk,
        name=rule.name,
        scope=rule.scope,
        methods=methods or None,
        key_kind=rule.key_kind,
        key_arg=rule.key_arg,
        key_function=key_function,
        limit=rule.limit,
        period=UNIT_SECONDS[rule.unit],
        algorithm=rule.algorithm,
        burst=rule.burst or rule.limit,
        action=rule.action,
        fail_mode=rule.fail_mode,
        state_prefix=state_prefix(_base36(rule.pk), rule.algorithm),
        header_meta_key=header_meta_key(rule.key_arg) if rule.key_kind == "header" else "",
    )


def header_meta_key(header: str) -> str:
    """Where WSGI and ASGI put a header in request.META: X-Api-Key is HTTP_X_API_KEY."""
    name = header.upper().replace("-", "_")
    return name if name in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + name


ALGORITHM_CODES = {
    "fixed_window": "f",
    "sliding_window_log": "l",
    "sliding_window_counter": "c",
    "token_bucket": "t",
    "leaky_bucket": "b",
}


def state_prefix(rule_id: str, algorithm: str) -> str:
    """``{thr}12f:``: the key prefix of one rule's per-client state.

    The braces make the prefix a Redis Cluster hash tag, so every key a request
    touches is in one slot and one script call is valid on a cluster. The
    algorithm's letter keeps state of another shape apart when a rule's
    algorithm is changed.
    """
    return f"{{{conf.KEY_PREFIX}}}{rule_id}{ALGORITHM_CODES[algorithm]}:"


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        number, rest = divmod(number, 36)
        out = digits[rest] + out
        if not number:
            return out


class RuleSet:
    """Enabled rules indexed by the form of their scope."""

    def __init__(self, rules: Iterable[CompiledRule] = ()) -> None:
        self.rules: tuple[CompiledRule, ...] = tuple(rules)
        self._everywhere: list[CompiledRule] = []
        self._prefixes: dict[str, list[CompiledRule]] = {}
        self._regexes: list[tuple[re.Pattern[str], CompiledRule]] = []
        self._named: dict[str, list[CompiledRule]] = {}
        for rule in self.rules:
            scope = rule.scope
            if scope == "*":
                self._everywhere.append(rule)
            elif scope.startswith("/"):
                self._prefixes.setdefault(scope, []).append(rule)
            elif scope.startswith("^"):
                self._regexes.append((re.compile(scope), rule))
            else:
                self._named.setdefault(scope, []).append(rule)
        # A path is looked up once per distinct prefix length, not once per rule.
        self._prefix_lengths = sorted({len(p) for p in self._prefixes})

    def __len__(self) -> int:
        return len(self.rules)

    def for_path(self, path: str, method: str) -> list[CompiledRule]:
        """Rules of scope '*', path prefix and regex that apply to this request."""
        found = [r for r in self._everywhere if r.applies_to(method)]
        prefixes = self._prefixes
        for length in self._prefix_lengths:
            if length > len(path):
                break
            for rule in prefixes.get(path[:length], ()):
                if rule.applies_to(method):
                    found.append(rule)
        for pattern, rule in self._regexes:
            if rule.applies_to(method) and pattern.match(path):
                found.append(rule)
        return found

    def for_scope(self, name: str, method: str) -> list[CompiledRule]:
        """Rules of a scope name (a @throttle scope or a URL name) that apply to this method."""
        return [r for r in self._named.get(name, ()) if r.applies_to(method)]

    def has_scope(self, name: str) -> bool:
        """Whether the admin has an enabled rule for this scope name (which replaces code defaults)."""
        return name in self._named


# -- where the rules version lives --------------------------------------------


class RedisVersion:
    """A random token in Redis, replaced whenever any process changes a rule."""

    def __init__(self) -> None:
        self.key = f"{conf.KEY_PREFIX}:rules:version"

    def _client(self) -> Any:
        # The store's client, with the decision timeouts rather than the cache's (seconds, or
        # none): a hung server must not hold a request at every refresh.
        from .store import get_store

        return get_store().client  # type: ignore[attr-defined]

    def read(self) -> Any:
        from redis.exceptions import ConnectionError

        from .store.fallback import breaker

        if breaker.is_open():  # the store failed moments ago: keep the rules, don't wait on it
            raise ConnectionError("the store is unavailable (circuit breaker open)")
        return self._client().get(self.key)

    def bump(self) -> None:
        self._client().set(self.key, uuid.uuid4().hex, ex=VERSION_KEY_TTL)


class DatabaseVersion:
    """Without Redis, a cheap fingerprint of the rule table stands in for the version."""

    def read(self) -> Any:
        from django.db.models import Count, Max

        from .models import Rule

        row = Rule.objects.aggregate(n=Count("pk"), last=Max("updated_at"))
        return (row["n"], row["last"])

    def bump(self) -> None:
        """Nothing to do: every write changes the row count or the latest updated_at."""


def load_rules() -> RuleSet:
    """Read and compile the enabled rules; a rule that cannot be compiled is skipped and logged."""
    from .models import Rule

    compiled = []
    for rule in Rule.objects.filter(enabled=True).order_by("pk"):
        try:
            compiled.append(compile_rule(rule))
        except Exception:
            logger.exception(
                "django_throttle: rule %r cannot be enforced and is skipped", rule.name
            )
    return RuleSet(compiled)


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
        self._failing: str | None = None
        self.bump_pending = False

    def get(self) -> RuleSet:
        rules = self._rules
        if rules is not None and self._clock() < self._next_check:
            return rules
        # One thread refreshes; the others keep serving the rules they have.
        if not self._lock.acquire(blocking=rules is None):
            return rules  # type: ignore[return-value]
        try:
            if self._rules is None or self._clock() >= self._next_check:
                self._refresh()
        finally:
            self._lock.release()
        return self._rules if self._rules is not None else RuleSet()

    def _refresh(self) -> None:
        self._next_check = self._clock() + conf.RULES_REFRESH
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

    def invalidate(self) -> None:
        """Re-read the rules at the next request of this process."""
        self._next_check = 0.0
        self._stale = True


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


def rules_changed() -> None:
    """A rule was written: once the transaction commits (at once in autocommit), this process
    reloads at its next request and the others within RULES_REFRESH. Nothing happens on a
    rollback."""
    cache = rule_cache()

    def committed() -> None:
        cache.invalidate()
        cache.announce()

    transaction.on_commit(committed)
