"""The engine's calls to the store, but refunds (refunds.py): a decision through the block
cache, a look that consumes nothing, a reset, a block."""

from __future__ import annotations

from collections.abc import Sequence

from .. import metrics
from ..compiled import CompiledRule
from ..conf import conf
from ..decision import Decision, from_results, unavailable
from ..rules import clients_reset
from ..store import Check, Result, StoreUnavailable, get_store
from .block_cache import Blocked, never_admitted, remember, remembered


def decide(
    checks: Sequence[Check], dry_run: bool = False, blocked: Blocked | None = None
) -> Decision:
    """One store call for these checks (none if there are none, or if the block cache knows
    one of their clients is rejected)."""
    if not checks:
        return Decision(allowed=True)  # a fresh one: callers may keep it
    known = _known(checks, dry_run, blocked)
    if known is not None:
        return known
    return _learn(checks, get_store().decide(checks, dry_run), dry_run, blocked)


async def adecide(
    checks: Sequence[Check], dry_run: bool = False, blocked: Blocked | None = None
) -> Decision:
    if not checks:
        return Decision(allowed=True)  # a fresh one: callers may keep it
    known = _known(checks, dry_run, blocked)
    if known is not None:
        return known
    return _learn(checks, await get_store().adecide(checks, dry_run), dry_run, blocked)


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


def _known(checks: Sequence[Check], dry_run: bool, blocked: Blocked | None) -> Decision | None:
    """A rejection known without the store, or None: a cost no enforcing rule's window or
    bucket can ever hold (so no single request makes Redis work for it), or what the block
    cache holds for one of these clients."""
    if dry_run:
        return None  # a dry run reports the state as it is
    for check in checks:
        rule = check.rule
        if check.cost > rule.burst and rule.enforcing:  # burst: a bucket's size, else the limit
            return from_results([never_admitted(check)])
    if not blocked:
        return None
    known = remembered(blocked, checks)
    if known is not None and metrics.switch.on:
        metrics.block_cache_hit(known.rule or "")
    return known


def _learn(
    checks: Sequence[Check],
    outcome: list[Result] | StoreUnavailable,
    dry_run: bool,
    blocked: Blocked | None,
) -> Decision:
    """The decision of a store call, after the block cache kept its rejections."""
    if blocked is not None and not dry_run and not isinstance(outcome, StoreUnavailable):
        remember(blocked, checks, outcome)
    return _summarize(outcome)


def _summarize(outcome: list[Result] | StoreUnavailable) -> Decision:
    if isinstance(outcome, StoreUnavailable):
        for check in outcome.checks:  # those the store could not decide (a cluster: some)
            if check.rule.fails_closed(conf.FAIL_OPEN):
                return unavailable(check.rule, outcome.retry_after, check.identity)
        if outcome.results is None:
            return Decision(allowed=True)  # a fresh one: callers may keep it
        return from_results(outcome.results)
    return from_results(outcome)
