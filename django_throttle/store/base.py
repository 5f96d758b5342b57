"""What every store takes and returns: checks in, one result per check out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..compiled import CompiledRule, outcomes_rule
from ..state_keys import BLOCK_SUFFIX, client_tag

# Algorithms whose state is a key per window, "<state key>:<window>" (decide.lua's header).
WINDOWED = frozenset({"fixed_window", "sliding_window_counter"})


class BlockReads:
    """Which block keys decisions read. A rule with a block duration of its own always has its
    read; every rule's only while ``every`` is true: while a block written by block.lua
    (``block_key()``, the dashboard's Block) may live, as the store's held key says (read with
    the rules version) or as this process knows, having written one. Shared by a process's
    backends."""

    __slots__ = ("every",)

    def __init__(self) -> None:
        self.every = False


def state_key(rule: CompiledRule, identity: str) -> str:
    return rule.state_prefix + client_tag(identity)


def block_key(rule: CompiledRule, identity: str) -> str:
    """The client's block under the rule: beside its state in the cluster (the same tag)."""
    return rule.block_prefix + client_tag(identity) + BLOCK_SUFFIX


def levels(values: Sequence[Any]) -> list[int]:
    """Block levels as read from the store (missing: 0)."""
    return [int(value) if value is not None else 0 for value in values]


def level_key(rule: CompiledRule, identity: str) -> str:
    """How many blocks a growing rule has given the client while it is remembered (decide.lua
    writes it when a block starts): beside its block key."""
    return block_key(rule, identity) + "g"


def client_keys(rule: CompiledRule, identity: str, now: float) -> list[str]:
    """Every key one client can have under ``rule`` around ``now`` (the store's clock, as this
    process estimates it): its block key and block level, its state key and, for windows, the key of every
    window a decision could count in or read from within a period either side of ``now``; the
    same of its counted outcomes' state for a rule that defers its block."""
    keys = [block_key(rule, identity), level_key(rule, identity)]
    for each in (rule, outcomes_rule(rule)) if rule.defers_block else (rule,):
        key = state_key(each, identity)
        keys.append(key)
        if rule.calendar is not None:
            keys += [f"{key}:{start}" for start in rule.calendar.starts(now)]
        elif rule.algorithm in WINDOWED:
            window = int(now // rule.period)
            keys += [f"{key}:{n}" for n in range(window - 2, window + 2)]
    return keys


@dataclass(slots=True)  # not frozen: built for every rule of every request (see Result)
class Check:
    """One rule to apply to one client identity (``"ip:203.0.113.7"``) at some cost."""

    rule: CompiledRule
    identity: str
    cost: int = 1
    # A give-back to a bucket: the arrival time (us) its decision left, where the request's
    # own interval ends; what it still holds is what is left of it (0: not known, the whole
    # cost's time is given back).
    until: int = 0


@dataclass(slots=True)  # not frozen: built for every check, and frozen costs 4x to build
class Result:
    """The outcome of one check. Times are seconds; ``reset_at`` is a Unix timestamp."""

    rule: CompiledRule
    identity: str
    allowed: bool
    limit: int
    remaining: int
    reset_at: float
    retry_after: float
    delay: float
    blocked: bool = False  # rejected by the rule's block duration (until retry_after)
    at: int = 0  # the store's time of the decision, in microseconds (what a refund undoes)
    cost: int = 1  # what the check asked for
    local: bool = False  # decided by this process's fallback while the store was unreachable
    # A log-only fixed window's count past its limit, which it goes on counting (sizing).
    past: int = 0


class Store(Protocol):
    def decide(self, checks: Sequence[Check], dry_run: bool = False) -> list[Result]:
        """Evaluate every check; commit all of them only if every enforcing one admits."""
        ...

    def reset(self, rule: CompiledRule, identity: str) -> None:
        """Forget the state of one client under one rule."""
        ...

    def block(self, checks: Sequence[Check], seconds: int) -> None:
        """Reject each check's client under its rule for ``seconds``, whatever its state."""
        ...

    def block_levels(self, checks: Sequence[Check]) -> list[int]:
        """How many blocks each check's rule has given its client while it is remembered."""
        ...

    def refund(self, checks: Sequence[Check], at: int = 0) -> None:
        """Give back what a decision at ``at`` (the results' ``at``; 0: none known, the newest
        state) committed for these checks; never below empty. Ends concurrency leases."""
        ...


def admitted(results: Sequence[Result]) -> bool:
    """Whether a request with these results is let through (shadow rules never block)."""
    return all(r.allowed or not r.rule.enforcing for r in results)
