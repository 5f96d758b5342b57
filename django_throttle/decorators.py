"""The ``@throttle`` view decorator."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction

from .conf import conf
from .models import Action, Algorithm, KeyKind
from .rates import parse_rate
from .responses import add_headers
from .rules import CompiledRule, RuleSet, state_prefix
from .throttling import (
    SEEN_ATTR,
    SPECS_ATTR,
    aenforce,
    agather,
    enforce,
    for_headers,
    gather,
    pending_specs,
)

V = TypeVar("V", bound=Callable[..., Any])

# Code defaults by scope, so reset(scope, ...) can find them too.
code_defaults: dict[str, list[ScopeSpec]] = {}


class DefaultRule:
    """A rule written in code (``rate=``), built lazily: the key prefix comes from settings."""

    def __init__(self, scope: str, rate: str, key: str, algorithm: str, burst: int | None):
        self.scope, self.rate, self.key, self.algorithm, self.burst = (
            scope,
            parse_rate(rate),
            key,
            algorithm,
            burst,
        )
        digest = hashlib.blake2b(
            f"{scope}|{self.rate}|{key}|{algorithm}|{burst}".encode(), digest_size=4
        ).hexdigest()
        self.rule_id = "c" + digest
        self._compiled: tuple[str, CompiledRule] | None = None

    def compile(self) -> CompiledRule:
        prefix = state_prefix(self.rule_id, self.algorithm)
        if self._compiled is None or self._compiled[0] != prefix:
            self._compiled = (
                prefix,
                CompiledRule(
                    id=0,
                    name=self.scope,
                    scope=self.scope,
                    methods=None,
                    key_kind=self.key,
                    key_arg="",
                    key_function=None,
                    limit=self.rate.limit,
                    period=self.rate.period,
                    algorithm=self.algorithm,
                    burst=self.burst or self.rate.limit,
                    action=Action.REJECT,
                    fail_mode="default",
                    state_prefix=prefix,
                ),
            )
        return self._compiled[1]


class ScopeSpec:
    """One ``@throttle(scope, ...)``: a scope name, its code default and its cost."""

    __slots__ = ("scope", "default", "cost")

    def __init__(self, scope: str, default: DefaultRule | None, cost: Any) -> None:
        self.scope = scope
        self.default = default
        self.cost = cost

    def rules(self, ruleset: RuleSet, method: str) -> list[CompiledRule]:
        # An enabled admin rule for the scope replaces the code default.
        if ruleset.has_scope(self.scope):
            return ruleset.for_scope(self.scope, method)
        return [self.default.compile()] if self.default is not None else []

    def cost_of(self, request: Any) -> int:
        cost = self.cost(request) if callable(self.cost) else self.cost
        return max(1, int(cost))


_CODE_KEY_KINDS = (KeyKind.IP, KeyKind.USER, KeyKind.USER_OR_IP, KeyKind.GLOBAL)


def throttle(
    scope: str,
    *,
    rate: str | None = None,
    key: str = "ip",
    algorithm: str = "sliding_window_counter",
    burst: int | None = None,
    cost: int | Callable[[Any], int] = 1,
) -> Callable[[V], V]:
    """Throttle a view by the admin rules of ``scope``; ``rate=`` is a code default used while
    the admin has no enabled rule for the scope."""
    if not scope or not isinstance(scope, str) or scope[0] in "*/^" or " " in scope:
        raise ValueError(f"@throttle scope {scope!r} must be a name such as 'login'.")
    if key not in _CODE_KEY_KINDS:
        raise ValueError(f"@throttle key {key!r} must be one of {', '.join(_CODE_KEY_KINDS)}.")
    if algorithm not in Algorithm.values:
        raise ValueError(
            f"@throttle algorithm {algorithm!r} must be one of {', '.join(Algorithm.values)}."
        )
    if burst is not None and algorithm not in ("token_bucket", "leaky_bucket"):
        raise ValueError("@throttle burst= needs algorithm token_bucket or leaky_bucket.")
    if not callable(cost) and (not isinstance(cost, int) or cost < 1):
        raise ValueError("@throttle cost= must be a positive int or a function of the request.")
    default = DefaultRule(scope, rate, key, algorithm, burst) if rate is not None else None
    spec = ScopeSpec(scope, default, cost)
    code_defaults.setdefault(scope, []).append(spec)

    def decorator(view: V) -> V:
        specs = [spec, *getattr(view, SPECS_ATTR, ())]
        if iscoroutinefunction(view):

            @wraps(view)
            async def async_wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
                pending = pending_specs(request, specs)
                if pending:
                    rejection = await aenforce(request, await agather(request, pending))
                    if rejection is not None:
                        return rejection
                response = await view(request, *args, **kwargs)
                return _with_headers(request, response)

            wrapper: Any = async_wrapper
        else:

            @wraps(view)
            def sync_wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
                pending = pending_specs(request, specs)
                if pending:
                    rejection = enforce(request, gather(request, pending))
                    if rejection is not None:
                        return rejection
                response = view(request, *args, **kwargs)
                return _with_headers(request, response)

            wrapper = sync_wrapper
        setattr(wrapper, SPECS_ATTR, specs)
        return wrapper  # type: ignore[no-any-return]

    return decorator


def _with_headers(request: Any, response: Any) -> Any:
    # With the middleware installed, it writes the headers once, for every decision made.
    if conf.HEADERS and not getattr(request, SEEN_ATTR, False) and hasattr(response, "__setitem__"):
        decision = for_headers(request)
        if decision is not None:
            add_headers(response, decision)
    return response
