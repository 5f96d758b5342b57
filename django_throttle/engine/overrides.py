"""A client's override of a rule: its own limit on the rule's state, or exempt."""

from __future__ import annotations

import time

from ..compiled import CompiledRule


def rule_for(rule: CompiledRule, key: str) -> CompiledRule | None:
    """The rule as it applies to client ``key``: its override's limit if it has one that has
    not ended, the rule itself if not; None if the client is exempt from it."""
    overrides = rule.overrides
    if overrides is not None and key in overrides:
        ends = rule.override_ends  # looked at only for a client with an override
        end = None if ends is None else ends.get(key)
        if end is None or time.time() < end:
            return overrides[key]
    return rule
