"""What applies to a request and has not counted it yet: the checks to decide."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from ..audience import counts
from ..compiled import ON_LOOP, WITH_USER, CompiledRule, every_call
from ..conf import conf
from ..decision import Decision, unavailable
from ..identities import identity
from ..rules import ScopeSpec, get_rules, request_rules, rule_cache
from ..runtime import runtime
from ..store import Check, Result
from .block_cache import Blocked
from .overrides import rule_for
from .request_state import RequestState, state_of

logger = logging.getLogger("django_throttle")


class Gathered:
    """The checks still to decide for a request, the results of rules that already counted
    it, or a decision already (a rule whose key cannot be computed and that fails closed);
    and the block cache of the rules they come from."""

    __slots__ = ("blocked", "checks", "earlier", "early", "state")

    def __init__(
        self,
        checks: list[Check],
        earlier: list[Result],
        early: Decision | None = None,
        blocked: Blocked | None = None,
        state: RequestState | None = None,
    ) -> None:
        self.checks = checks
        self.earlier = earlier
        self.early = early
        self.blocked = blocked
        self.state = state  # the request's, when gathering made or found it


class NeedsThread(Exception):
    """Gathering must run in a thread: it may use the database."""


def gather(
    request: Any,
    specs: Iterable[ScopeSpec] = (),
    *,
    paths: bool = False,
    url_name: str | None = None,
    cost: int | None = None,
    dry_run: bool = False,
    on_loop: bool = False,
) -> Gathered:
    """What applies to this request and has not counted it yet. ``cost`` replaces each
    rule's cost (``check()``); a dry run looks at every rule, counted or not. ``on_loop``:
    called on an event loop, where the database must not be used; NeedsThread is raised,
    before anything about the request is changed, if the rules must be refreshed or a rule
    needs the user (not loaded yet), its groups or a key function."""
    state = state_of(request)
    counted = state.counted
    decided_now: list[ScopeSpec] = []
    if specs and cost is None and not dry_run:
        decided = state.decided_specs
        specs = decided_now = [spec for spec in specs if id(spec) not in decided]
        if not specs and not paths and not url_name:
            return Gathered([], [])  # a decorator whose scopes the middleware decided
    checks: list[Check] = []
    earlier: list[Result] = []
    memo: dict[str, str | None] = {}
    if on_loop:
        fresh = rule_cache().fresh()
        if fresh is None:
            raise NeedsThread  # a refresh may read the database
        ruleset = fresh
        user_loaded = hasattr(request, "_cached_user")  # AuthenticationMiddleware's cache
    else:
        ruleset = get_rules()
    # Without EXEMPT_NETWORKS, a rule that counts everyone counts this request: no call to
    # counts() for it.
    anyone = not conf.EXEMPT_NETWORKS
    # Whether the response will be seen (the middleware, or @throttle: its own decision, or a
    # check() inside its view) and its status counted then; if not, every call counts.
    settled = paths or cost is None or state.middleware or bool(state.decided_specs)
    for rule, rule_cost in request_rules(ruleset, request, specs, paths=paths, url_name=url_name):
        if on_loop and rule.on_loop != ON_LOOP and not (rule.on_loop == WITH_USER and user_loaded):
            raise NeedsThread
        done = counted.get(rule.state_prefix)
        if done is not None and not dry_run:
            earlier.append(done)
            continue
        try:
            if not (anyone and rule.everyone) and not counts(rule, request, memo):
                continue  # outside the rule's audience, or exempt
            who = identity(rule, request, memo)
        except Exception:
            runtime().part(KeyErrors).log(rule)
            if rule.fails_closed(conf.FAIL_OPEN):
                return Gathered([], [], unavailable(rule, rule.period))
            continue
        if who is None:
            continue
        if rule.overrides is not None:  # tested here: most rules have none, and a call costs
            own = rule_for(rule, who)
            if own is None:
                continue  # this client is exempt from the rule
            rule = own  # this client's own limit, on the same state
        if rule.defers_block and not settled:
            rule = every_call(rule)
        checks.append(Check(rule, who, rule_cost if cost is None else cost))
    if decided_now:
        state.decided_specs.update(id(spec) for spec in decided_now)
    return Gathered(checks, earlier, None, ruleset.blocked, state)


KEY_ERROR_LOG_EVERY = 60.0  # seconds: a broken key function is logged, not once per request


class KeyErrors:
    """When the failure of each rule's key was last logged (by state prefix, monotonic)."""

    def __init__(self) -> None:
        self.logged: dict[str, float] = {}

    def log(self, rule: CompiledRule) -> None:
        now = time.monotonic()
        if now - self.logged.get(rule.state_prefix, -KEY_ERROR_LOG_EVERY) >= KEY_ERROR_LOG_EVERY:
            self.logged[rule.state_prefix] = now
            logger.exception(
                "django_throttle: the key of rule %r could not be computed; its fail mode "
                "applies (logged at most once a minute)",
                rule.name,
            )
