"""A client's override of a rule: its own limit on the rule's state, or exempt."""

from __future__ import annotations

from ..compiled import CompiledRule


def rule_for(rule: CompiledRule, key: str) -> CompiledRule | None:
    """The rule as it applies to client ``key``: its override's limit if it has one, the rule
    itself if not; None if the client is exempt from it."""
    overrides = rule.overrides
    if overrides is not None and key in overrides:
        return overrides[key]
    return rule
