"""A scope's rules applied to an explicit key, without a request (workers, tasks, queue
consumers, the management commands, the dashboard): decide, refund, reset, block."""

from __future__ import annotations

from asgiref.sync import sync_to_async

from ..choices import Algorithm
from ..compiled import MAX_BLOCK, every_call
from ..costs import valid_cost
from ..decision import Decision
from ..rules import RuleSet, get_rules, scope_rules
from ..store import Check
from .announcing import announce
from .deciding import adecide, block_rules, decide, reset_rules
from .overrides import rule_for
from .refunds import Refund, agive_back, give_back


def decide_key(scope: str, key: str, cost: int = 1, dry_run: bool = False) -> Decision:
    """``check_key()``: count an event of client ``key`` against the rules of ``scope``."""
    cost = key_arguments(scope, key, cost)
    checks, ruleset = key_checks(scope, key, cost)
    decision = decide(checks, dry_run, ruleset.blocked)
    if checks and not dry_run:
        announce(None, decision)
    return decision


async def adecide_key(scope: str, key: str, cost: int = 1, dry_run: bool = False) -> Decision:
    cost = key_arguments(scope, key, cost)
    # Loading changed rules may query the database, which the event loop must not.
    checks, ruleset = await sync_to_async(key_checks)(scope, key, cost)
    decision = await adecide(checks, dry_run, ruleset.blocked)
    if checks and not dry_run:
        announce(None, decision)
    return decision


def refund_key(scope: str, key: str, cost: int = 1) -> int:
    """Give back ``cost`` to client ``key`` under the rules of ``scope``, from its newest
    state; how many rules were refunded."""
    checks, _ = key_checks(scope, key, key_arguments(scope, key, cost))
    give_back([Refund(0, False, checks)] if checks else [], announce=True)
    return len(checks)


def charge_key(scope: str, key: str, cost: int) -> int:
    """Add ``cost`` to client ``key`` under the rules of ``scope`` now, without a decision: work
    done whose cost is known only afterwards (the tokens of an LLM call), counted even past a
    limit, so that later decisions wait until it has drained. How many rules were charged
    (never a concurrency rule: its slots are requests in flight, not units)."""
    cost = key_arguments(scope, key, cost)
    checks = charged(key_checks(scope, key, -cost)[0])  # a negative cost charges (refund.lua)
    give_back([Refund(0, False, checks)] if checks else [])
    return len(checks)


async def acharge_key(scope: str, key: str, cost: int) -> int:
    cost = key_arguments(scope, key, cost)
    # Loading changed rules may query the database, which the event loop must not.
    checks = charged((await sync_to_async(key_checks)(scope, key, -cost))[0])
    await agive_back([Refund(0, False, checks)] if checks else [])
    return len(checks)


def charged(checks: list[Check]) -> list[Check]:
    """The checks a charge applies to: all but concurrency rules'."""
    return [check for check in checks if check.rule.algorithm != _CONCURRENCY]


_CONCURRENCY = str(Algorithm.CONCURRENCY)


def reset_key(scope: str, key: str) -> int:
    """Forget client ``key``'s state under every rule of ``scope``; how many rules."""
    return reset_rules(scope_rules(get_rules(), scope), key)


def block_key(scope: str, key: str, seconds: int) -> int:
    """Reject client ``key`` under every rule of ``scope`` (admin rules, else code defaults) for
    ``seconds``, in every process; how many rules. An override's own limit keeps the block
    (the same state); an exempt client stays exempt. ``reset_key()`` ends it."""
    key_arguments(scope, key, 1)
    return block_rules(scope_rules(get_rules(), scope), key, block_seconds(seconds))


async def ablock_key(scope: str, key: str, seconds: int) -> int:
    key_arguments(scope, key, 1)
    block_seconds(seconds)  # the arguments' errors raised here, not in the thread
    # Loading changed rules may query the database, which the event loop must not; an
    # operator's block is rare: the sync client in a thread.
    return await sync_to_async(block_key)(scope, key, seconds)


def block_seconds(seconds: object) -> int:
    """``seconds`` if it is a block's length (a whole number from 1 to a year, as a rule's
    block duration); ValueError otherwise."""
    if type(seconds) is not int or not 1 <= seconds <= MAX_BLOCK:
        raise ValueError(
            f"seconds must be a whole number from 1 to {MAX_BLOCK} (a year), not {seconds!r}"
        )
    return seconds


def key_checks(scope: str, key: str, cost: int) -> tuple[list[Check], RuleSet]:
    """The checks of ``scope``'s rules in force (admin rules, else code defaults) for ``key``,
    whatever each rule's key kind; an override of the key applies (its limit, or exempt).
    Who a rule applies to (users, groups, networks) is a request's matter and not looked at."""
    ruleset = get_rules()
    checks = []
    for rule in scope_rules(ruleset, scope):
        own = rule_for(rule, key)
        if own is not None:
            checks.append(Check(every_call(own), key, cost))  # no response to count by
    return checks, ruleset


def key_arguments(scope: object, key: object, cost: object) -> int:
    """The cost, once the arguments are known to be usable; ValueError says which is not."""
    if not isinstance(scope, str) or not scope:
        raise ValueError(f"scope must be a non-empty string such as 'partner-api', not {scope!r}")
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty string such as 'partner:acme', not {key!r}")
    return valid_cost(cost)
