"""Rules: loaded, compiled, cached and versioned per process; code defaults; selection."""

from __future__ import annotations

from ..compiled import CompiledRule, build_rule, compile_rule
from .cache import (
    RULE_SETTINGS,
    DatabaseVersion,
    RedisVersion,
    RuleCache,
    clients_reset,
    get_rules,
    load_rules,
    rule_cache,
    rules_changed,
)
from .defaults import DefaultRule, ScopeSpec, default_scopes, defaults_of, register
from .ruleset import RuleSet, request_rules, scope_rules

__all__ = (
    "RULE_SETTINGS",
    "CompiledRule",
    "DatabaseVersion",
    "DefaultRule",
    "RedisVersion",
    "RuleCache",
    "RuleSet",
    "ScopeSpec",
    "build_rule",
    "clients_reset",
    "compile_rule",
    "default_scopes",
    "defaults_of",
    "get_rules",
    "load_rules",
    "register",
    "request_rules",
    "rule_cache",
    "rules_changed",
    "scope_rules",
)
