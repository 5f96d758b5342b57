"""``RuleSet``: the enabled rules of a process, indexed by the form of their scope."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..compiled import CompiledRule
from ..patterns import UnsafePattern, compile_scope_set


class RuleSet:
    """Built once per rule change, so matching a request looks only at rules that can apply."""

    def __init__(self, rules: Iterable[CompiledRule] = (), block_cache: bool = False) -> None:
        self.rules: tuple[CompiledRule, ...] = tuple(rules)
        # Clients this process saw rejected until a known time, under these rules: state key
        # -> (until, on the monotonic clock; the rejection). None: BLOCK_CACHE is off. A
        # reload carries over the entries of the rules it did not change; a reset or refund
        # anywhere empties it within RULES_REFRESH (rules/cache.py).
        self.blocked: dict[str, tuple[float, Any]] | None = {} if block_cache else None
        # Primary key -> (the row it was compiled from, the compiled rule): what the next
        # reload reuses (load_rules()).
        self.sources: dict[int, tuple[object, CompiledRule]] = {}
        self._everywhere: list[CompiledRule] = []
        self._prefixes: dict[str, list[CompiledRule]] = {}
        self._regexes: list[CompiledRule] = []
        self._by_scope: dict[str, list[CompiledRule]] = {}
        for rule in self.rules:
            scope = rule.scope
            self._by_scope.setdefault(scope, []).append(rule)
            if scope == "*":
                self._everywhere.append(rule)
            elif scope.startswith("/"):
                self._prefixes.setdefault(scope, []).append(rule)
            elif rule.match is not None:
                self._regexes.append(rule)
        # Every regex scope in one RE2 program: one pass over the path, however many rules.
        regexes = self._regexes
        try:
            self._match_regexes = compile_scope_set(
                [r.scope for r in regexes], [r.match for r in regexes if r.match is not None]
            )
        except UnsafePattern:  # pragma: no cover - each scope compiled alone already
            self._match_regexes = self._one_by_one
        # A path is looked up once per distinct prefix length, not once per rule.
        self._prefix_lengths = sorted({len(p) for p in self._prefixes})
        # The scopes none of whose rules is limited to some methods: their rules as they are.
        self._any_method: dict[str, tuple[CompiledRule, ...]] = {
            scope: tuple(rules)
            for scope, rules in self._by_scope.items()
            if all(r.methods is None for r in rules)
        }

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
        if self._regexes:
            regexes = self._regexes
            for i in self._match_regexes(path):
                if regexes[i].applies_to(method):
                    found.append(regexes[i])
        return found

    def _one_by_one(self, path: str) -> list[int]:
        return [i for i, r in enumerate(self._regexes) if r.match is not None and r.match(path)]

    def for_scope(self, scope: str, method: str | None = None) -> Sequence[CompiledRule]:
        """Rules whose scope is exactly ``scope`` (a scope name, or '*', a prefix, a regex as
        written), that apply to ``method`` (None: whatever their methods)."""
        rules = self._any_method.get(scope)
        if rules is not None:
            return rules
        return [r for r in self._by_scope.get(scope, ()) if method is None or r.applies_to(method)]

    def has_scope(self, scope: str) -> bool:
        """Whether the admin has an enabled rule for this scope (which replaces code defaults)."""
        return scope in self._by_scope
