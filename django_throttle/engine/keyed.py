"""Deciding a scope for an explicit key, without a request: workers, tasks, queue consumers."""

from __future__ import annotations

from ..rules import RuleSet, get_rules, scope_rules
from ..store import Check


def key_checks(scope: str, key: str, cost: int) -> tuple[list[Check], RuleSet]:
    """The checks of ``scope``'s rules in force (admin rules, else code defaults) for ``key``,
    whatever each rule's key kind; an override of the key applies (its limit, or exempt).
    Who a rule applies to (users, groups, networks) is a request's matter and not looked at."""
    ruleset = get_rules()
    checks = []
    for rule in scope_rules(ruleset, scope):
        overrides = rule.overrides
        if overrides is not None and key in overrides:
            own = overrides[key]
            if own is None:
                continue
            rule = own
        checks.append(Check(rule, key, cost))
    return checks, ruleset


def key_arguments(scope: object, key: object, cost: object) -> int:
    """The cost, once the arguments are known to be usable; ValueError says which is not."""
    if not isinstance(scope, str) or not scope:
        raise ValueError(f"scope must be a non-empty string such as 'partner-api', not {scope!r}")
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty string such as 'partner:acme', not {key!r}")
    return valid_cost(cost)


def valid_cost(cost: object) -> int:
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
        raise ValueError(f"cost must be a positive whole number, not {cost!r}")
    return cost
