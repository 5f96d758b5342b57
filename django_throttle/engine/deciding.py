"""The engine's calls to the store for an operator or a dashboard, never on a request's path: a
look that consumes nothing, a reset, a block. (Decisions: pipeline.py; refunds: refunds.py.)"""

from __future__ import annotations

from collections.abc import Sequence

from ..compiled import CompiledRule
from ..rules import clients_reset
from ..store import Check, Result, get_store


def inspect(rules: Sequence[CompiledRule], key: str) -> list[Result]:
    """The state of client ``key`` under each rule, in one store call that consumes nothing
    (none without rules); the store's error is raised. Overrides are the caller's (rule_for)."""
    if not rules:
        return []
    return get_store().inspect([Check(rule, key) for rule in rules])


def block_levels(rules: Sequence[CompiledRule], key: str) -> list[int]:
    """How many blocks each growing rule has given client ``key`` while it is remembered (0
    under other rules), in one store call when a rule grows (none otherwise)."""
    growing = [rule for rule in rules if rule.block_growth > 1]
    if not growing:
        return [0] * len(rules)
    levels = get_store().block_levels([Check(rule, key) for rule in growing])
    found = dict(zip(map(id, growing), levels, strict=True))
    return [found.get(id(rule), 0) for rule in rules]


def reset_rules(rules: Sequence[CompiledRule], key: str) -> int:
    """Forget client ``key``'s state under each rule, and tell every process's block cache
    (within RULES_REFRESH, no rule reloads); how many rules. The store's error is raised."""
    store = get_store()
    for rule in rules:
        store.reset(rule, key)
    if rules:
        clients_reset([rule.state_prefix + key for rule in rules])
    return len(rules)


def block_rules(rules: Sequence[CompiledRule], key: str, seconds: int) -> int:
    """Reject client ``key`` under each rule for ``seconds`` in every process (one atomic
    store call; on a cluster, one per slot group), and tell every process's block cache as a
    reset does; how many rules. The store's error is raised."""
    if rules:
        get_store().block([Check(rule, key) for rule in rules], seconds)
        clients_reset([rule.state_prefix + key for rule in rules])
    return len(rules)
