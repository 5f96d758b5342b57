"""``RuleSet``: the enabled rules of a process, indexed by the form of their scope."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..compiled import CompiledRule
from ..patterns import UnsafePattern, compile_scope_set, literal_prefix
from .bans import BanIndex


class RuleSet:
    """Built once per rule change, so matching a request looks only at rules that can apply."""

    def __init__(
        self,
        rules: Iterable[CompiledRule] = (),
        block_cache: bool = False,
        bans: BanIndex | None = None,
    ) -> None:
        self.rules: tuple[CompiledRule, ...] = tuple(rules)
        # The bans loaded with the rules (ThrottleMiddleware looks every request up in them);
        # None without any: the request looks no further.
        self.bans = bans if bans else None
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
        # Regex scopes grouped by the literal text right after their "^" (a path is looked
        # up once per distinct length, as prefixes are); each group's scopes in one RE2 set:
        # a request runs the groups its path starts with, however many rules there are.
        groups: dict[str, list[CompiledRule]] = {}
        for rule in self._regexes:
            groups.setdefault(literal_prefix(rule.scope), []).append(rule)
        self._regex_groups = {text: _group_matcher(rules) for text, rules in groups.items()}
        self._regex_lengths = sorted({len(text) for text in groups})
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
            groups = self._regex_groups
            for length in self._regex_lengths:
                if length > len(path):
                    break
                group = groups.get(path[:length])
                if group is not None:
                    found.extend(r for r in group(path) if r.applies_to(method))
        return found

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


def _group_matcher(rules: list[CompiledRule]) -> Callable[[str], list[CompiledRule]]:
    """The rules among ``rules`` (regex scopes) whose pattern matches a path."""
    if len(rules) == 1:
        rule = rules[0]
        match = rule.match
        assert match is not None
        return lambda path: [rule] if match(path) else []
    try:
        matches = compile_scope_set(
            [r.scope for r in rules], [r.match for r in rules if r.match is not None]
        )
    except UnsafePattern:  # pragma: no cover - each scope compiled alone already
        return lambda path: [r for r in rules if r.match is not None and r.match(path)]
    return lambda path: [rules[i] for i in matches(path)]
