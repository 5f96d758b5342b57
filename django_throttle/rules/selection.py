"""What applies: the one place that picks the rules of a scope or of a request."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..compiled import CompiledRule
from .defaults import ScopeSpec, defaults_of
from .ruleset import RuleSet


def scope_rules(ruleset: RuleSet, scope: str, method: str | None = None) -> Sequence[CompiledRule]:
    """The rules in force for ``scope``: its enabled admin rules (those applying to
    ``method``, if given), else its code defaults."""
    if ruleset.has_scope(scope):
        return ruleset.for_scope(scope, method)
    return [default.compile() for default in defaults_of(scope)]


def request_rules(
    ruleset: RuleSet,
    request: Any,
    specs: Iterable[ScopeSpec] = (),
    *,
    paths: bool = False,
    url_name: str | None = None,
) -> list[tuple[CompiledRule, int]]:
    """The rules that apply to a request, each once, with its cost: path rules ('*', prefixes,
    regexes) if ``paths``, the rules of its URL name, and those of each scope in ``specs``
    (the highest cost wins when several name the same rule)."""
    method = request.method or "GET"
    if not paths and not url_name and isinstance(specs, list) and len(specs) == 1:
        # One scope (check(), a single @throttle): its rules are distinct, nothing to merge.
        spec = specs[0]
        rules = scope_rules(ruleset, spec.scope, method)
        if not rules:
            return []
        cost = spec.cost_of(request)
        return [(rule, cost) for rule in rules]
    chosen: dict[str, tuple[CompiledRule, int]] = {}
    if paths:
        for rule in ruleset.for_path(request.path_info, method):
            chosen[rule.state_prefix] = (rule, 1)
    if url_name:
        # A URL name brings its admin rules; code defaults come with the view's @throttle.
        for rule in ruleset.for_scope(url_name, method):
            chosen.setdefault(rule.state_prefix, (rule, 1))
    for spec in specs:
        rules = scope_rules(ruleset, spec.scope, method)
        if rules:
            cost = spec.cost_of(request)
            for rule in rules:
                previous = chosen.get(rule.state_prefix)
                chosen[rule.state_prefix] = (rule, max(cost, previous[1] if previous else 0))
    return list(chosen.values())
