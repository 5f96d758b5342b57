"""Code defaults: the rules ``@throttle(scope, rate=...)`` registers, for every entry point."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from django.urls import get_resolver

from ..choices import Action
from ..compiled import CompiledRule, build_rule, calendar_of
from ..conf import conf
from ..costs import clamped_cost
from ..rates import Rate
from ..runtime import Runtime, runtime
from ..state_keys import state_prefix
from ..statuses import parse_statuses, status_items

logger = logging.getLogger("django_throttle")

Cost = int | Callable[[Any], int]


class DefaultRule:
    """A rule written in code, compiled lazily: its state keys depend on settings."""

    def __init__(
        self,
        scope: str,
        rate: Rate,
        key: str,
        algorithm: str,
        burst: int | None,
        count_statuses: str = "",
    ) -> None:
        self.scope, self.rate, self.key, self.algorithm, self.burst = (
            scope,
            rate,
            key,
            algorithm,
            burst,
        )
        self.count_statuses = parse_statuses(count_statuses)  # ValueError: the decorator's
        # The statuses join the digest only when given: a default's state keys stay as they were.
        counted = f"|{','.join(status_items(count_statuses))}" if self.count_statuses else ""
        digest = hashlib.blake2b(
            f"{scope}|{rate}|{key}|{algorithm}|{burst}{counted}".encode(), digest_size=4
        ).hexdigest()
        self.rule_key = "c" + digest
        self._compiled: CompiledRule | None = None

    def compile(self) -> CompiledRule:
        prefix = state_prefix(self.rule_key, self.algorithm)  # follows KEY_PREFIX
        compiled = self._compiled
        if (
            compiled is None
            or compiled.state_prefix != prefix
            or (compiled.calendar is not None and compiled.calendar.zone.key != conf.TIME_ZONE)
        ):
            compiled = self._compiled = build_rule(
                id=0,
                name=self.scope,
                scope=self.scope,
                key_kind=self.key,
                limit=self.rate.limit,
                period=self.rate.period,
                algorithm=self.algorithm,
                burst=self.burst,
                action=Action.REJECT,
                rule_key=self.rule_key,
                calendar=calendar_of(self.rate.per, self.rate.unit),
                count_statuses=self.count_statuses,
            )
        return compiled


class ScopeSpec:
    """One ``@throttle(scope, ...)``: a scope name, its code default and its cost."""

    __slots__ = ("scope", "default", "cost")

    def __init__(self, scope: str, default: DefaultRule | None, cost: Cost) -> None:
        self.scope = scope
        self.default = default
        self.cost = cost

    def cost_of(self, request: Any) -> int:
        # A constant was checked by valid_cost() when the decorator was applied.
        return clamped_cost(self.cost(request)) if callable(self.cost) else self.cost


class Registry:
    """The code defaults by scope, as decorators registered them (a runtime part, handed on
    when the runtime is replaced: decorators run once, at import)."""

    from_code = True

    def __init__(self) -> None:
        self.defaults: dict[str, list[DefaultRule]] = {}
        self.views_imported = False
        self.lock = threading.Lock()

    def handover(self, successor: Runtime) -> None:
        with self.lock:
            successor.part(Registry).defaults = {s: list(d) for s, d in self.defaults.items()}


def register(spec: ScopeSpec) -> None:
    """Make a decorator's code default known to every entry point of its scope."""
    default = spec.default
    if default is not None:
        registry = runtime().part(Registry)
        with registry.lock:
            known = registry.defaults.setdefault(spec.scope, [])
            if all(d.rule_key != default.rule_key for d in known):  # the same default twice
                known.append(default)


def default_scopes() -> list[str]:
    """Every scope that has a code default, sorted (for the dashboard)."""
    registry = _imported()
    return sorted(scope for scope, defaults in registry.defaults.items() if defaults)


def defaults_of(scope: str) -> list[DefaultRule]:
    """The code defaults registered for a scope, in the order their views were decorated."""
    return _imported().defaults.get(scope, [])


def _imported() -> Registry:
    # Decorators register their defaults when their module is imported, which for most views
    # is when the URLconf is first loaded. A management command or a check() before the first
    # request must find them too: load the URLconf (once; Django caches it).
    registry = runtime().part(Registry)
    if not registry.views_imported:
        registry.views_imported = True
        try:
            get_resolver().url_patterns  # noqa: B018  (the property imports the URLconf)
        except Exception:
            logger.exception(
                "django_throttle: the URLconf could not be loaded to find code defaults"
            )
    return registry
