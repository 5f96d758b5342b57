"""Store errors never become 500s.

A circuit breaker keeps requests from waiting on a store that just failed; while
it is open, fail-open rules are enforced per process by an in-memory store (the
local fallback, unless LOCAL_FALLBACK is off) and fail-closed rules are
reported unavailable, which the caller answers with 503.

On a Redis Cluster, each slot group of a request is sent only if the breaker of its master
lets it (cluster.node_breakers); the groups of the masters that failed follow the fail modes
and the others are decided in Redis, all or nothing over the whole request. The store's own
breaker then stands for the cluster as a whole: it opens when no node gives a slot map.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from redis.exceptions import TryAgainError

from .. import metrics
from ..compiled import CompiledRule
from ..conf import conf
from ..keyspace import client_tag
from .base import Check, Result, Store, admitted
from .breaker import CLOSED, Breaker
from .cluster import (
    AsyncClusterStore,
    ClusterStore,
    Plan,
    answered,
    assemble,
    node_breakers,
    slot_of_tag,
)
from .errors import STORE_ERRORS
from .memory import MemoryStore
from .redis import AsyncRedisStore

AsyncStore = AsyncRedisStore | AsyncClusterStore


@dataclass(frozen=True, slots=True)
class StoreUnavailable:
    """The store could not decide ``checks`` (all of the request's, or on a cluster those
    whose master failed); ``results`` are the local fallback's for the fail-open rules among
    them, and the store's for the others."""

    results: list[Result] | None
    retry_after: float
    checks: Sequence[Check] = ()


def fails_closed(rule: CompiledRule) -> bool:
    return rule.fails_closed(conf.FAIL_OPEN)


breaker = Breaker(lambda: conf.BREAKER_INTERVAL)
local_fallback = MemoryStore()


def _unavailable(
    checks: Sequence[Check], dry_run: bool, retry_after: float | None = None
) -> StoreUnavailable:
    results = None
    if conf.LOCAL_FALLBACK:
        open_checks = [c for c in checks if not fails_closed(c.rule)]
        if open_checks:
            results = local_fallback.decide(open_checks, dry_run)
            for result in results:
                result.local = True  # a refund or a lease's end goes back here
            if not dry_run and metrics.switch.on:
                metrics.fallback_decided(results)
    if retry_after is None:
        retry_after = breaker.retry_after
    return StoreUnavailable(results, retry_after, checks)


def breaker_moved() -> None:
    """Show the breakers' state on the store_available gauge (0 while any is open)."""
    if metrics.switch.on:
        metrics.store_state(lambda: breaker.state == CLOSED and node_breakers.all_closed())


def node_open(store: object, key: str) -> bool:
    """Whether, on a cluster, the breaker of the master that holds ``key`` says it failed
    moments ago (outside a cluster, the store's one breaker says it: ``breaker.is_open()``)."""
    if not isinstance(store, (ClusterStore, AsyncClusterStore)):
        return False
    node = store.node_of_key(key)
    return node is not None and node_breakers.is_open(node)


def by_node(store: object, checks: Sequence[Check]) -> list[tuple[Breaker | None, Sequence[Check]]]:
    """The checks by the breaker of the master that holds them, on a cluster; elsewhere one
    group with None (the store's one breaker covers them)."""
    if not isinstance(store, (ClusterStore, AsyncClusterStore)):
        return [(None, checks)]
    groups: dict[str | None, list[Check]] = {}
    for check in checks:
        node = store.node_of_slot(slot_of_tag(client_tag(check.identity)))
        groups.setdefault(node, []).append(check)
    return [(None if n is None else node_breakers.of(n), group) for n, group in groups.items()]


def decide_guarded(
    store_of: Callable[[], Store], checks: Sequence[Check], dry_run: bool
) -> list[Result] | StoreUnavailable:
    """The store's decision, or what the fail modes make of the checks it could not decide.
    On a cluster the breaker guards reading the slot map; each master's, its slot groups."""
    token = breaker.allow()
    if token is None:
        return _unavailable(checks, dry_run)
    timed = metrics.switch.on
    start = time.perf_counter() if timed else 0.0
    try:
        try:
            store = store_of()
            if isinstance(store, ClusterStore):
                results = _on_cluster(store, checks, dry_run)
            else:
                results = store.decide(checks, dry_run)
        finally:
            if timed:
                metrics.store_timed(time.perf_counter() - start)
    except TryAgainError:
        return _unavailable(checks, dry_run)  # a slot migrating: this request only
    except STORE_ERRORS as exc:
        breaker.failed(exc, token)
        breaker_moved()
        return _unavailable(checks, dry_run)
    except BaseException:
        breaker.abandoned(token)  # interrupted: no verdict on the store, never a stuck probe
        raise
    if breaker.state != CLOSED:  # this call may be the probe that closes the breaker
        breaker.succeeded(token)
        breaker_moved()
    return results


# -- a cluster: a breaker per master ----------------------------------------------------


def _on_cluster(
    store: ClusterStore, checks: Sequence[Check], dry_run: bool
) -> list[Result] | StoreUnavailable:
    """A decision on a cluster, each slot group behind its master's breaker. Raises only what
    concerns the whole cluster (its slot map cannot be read) or no store at all."""
    plan = store.plan(checks)
    guards = [node_breakers.of(node) for node in plan.nodes]
    tokens = _allow(guards)
    try:
        replies = store.send(plan, dry_run, tokens)
    except BaseException:
        _abandon(guards, tokens)  # interrupted: no verdict on any node
        raise
    failed = _report(guards, tokens, replies)
    if not failed:
        return store.settle(plan, replies, dry_run)
    error = _not_the_store(replies)
    if error is not None:
        if not dry_run:
            store.refund_committed(plan, replies)
        raise error
    retry_after = max(guards[n].retry_after for n in failed)
    lost = _checks_of(plan, failed)
    if len(failed) == len(replies) or any(fails_closed(c.rule) for c in lost):
        # Refused as a whole (or nothing answered): what the answered groups took goes back.
        if not dry_run:
            store.refund_committed(plan, replies)
        return _unavailable(lost, dry_run, retry_after)
    local, admit = _locally(plan, replies, lost, dry_run)
    refunded = store.refund_committed(plan, replies) if not admit and not dry_run else set()
    return _partly(plan, replies, refunded, local, retry_after, lost)


async def _aon_cluster(
    store: AsyncClusterStore, checks: Sequence[Check], dry_run: bool
) -> list[Result] | StoreUnavailable:
    """_on_cluster() on the event loop's asyncio store."""
    plan = await store.plan(checks)
    guards = [node_breakers.of(node) for node in plan.nodes]
    tokens = _allow(guards)
    try:
        replies = await store.send(plan, dry_run, tokens)
    except BaseException:
        _abandon(guards, tokens)
        raise
    failed = _report(guards, tokens, replies)
    if not failed:
        return await store.settle(plan, replies, dry_run)
    error = _not_the_store(replies)
    if error is not None:
        if not dry_run:
            await store.refund_committed(plan, replies)
        raise error
    retry_after = max(guards[n].retry_after for n in failed)
    lost = _checks_of(plan, failed)
    if len(failed) == len(replies) or any(fails_closed(c.rule) for c in lost):
        if not dry_run:
            await store.refund_committed(plan, replies)
        return _unavailable(lost, dry_run, retry_after)
    local, admit = _locally(plan, replies, lost, dry_run)
    refunded = await store.refund_committed(plan, replies) if not admit and not dry_run else set()
    return _partly(plan, replies, refunded, local, retry_after, lost)


def _allow(guards: Sequence[Breaker]) -> list[int | None]:
    """Each group's token; the groups of one master share one (a recovering master's one
    probe carries all of them, rather than the second group finding the probe taken)."""
    given: dict[int, int | None] = {}
    tokens = []
    for guard in guards:
        key = id(guard)
        if key not in given:
            given[key] = guard.allow()
        tokens.append(given[key])
    return tokens


def _abandon(guards: Sequence[Breaker], tokens: Sequence[int | None]) -> None:
    for guard, token in zip(guards, tokens, strict=True):
        if token is not None:
            guard.abandoned(token)


def _report(
    guards: Sequence[Breaker], tokens: Sequence[int | None], replies: Sequence[object]
) -> list[int]:
    """Tell each master's breaker how its group went; the groups not decided in Redis."""
    failed = []
    moved = False
    for number, (guard, token, reply) in enumerate(zip(guards, tokens, replies, strict=True)):
        if token is None:
            failed.append(number)  # its master failed moments ago: not sent
        elif isinstance(reply, BaseException):
            failed.append(number)
            if isinstance(reply, STORE_ERRORS) and not isinstance(reply, TryAgainError):
                guard.failed(reply, token)
                moved = True
            else:  # a slot migrating (this request only), or not the store's doing
                guard.abandoned(token)
        elif guard.state != CLOSED:  # this call may be the probe that closes the breaker
            guard.succeeded(token)
            moved = True
    if moved:
        breaker_moved()
    return failed


def _not_the_store(replies: Sequence[object]) -> BaseException | None:
    """A group's error that is not the store's (a bug): raised, as without a breaker."""
    for reply in replies:
        if isinstance(reply, BaseException) and not isinstance(reply, STORE_ERRORS):
            return reply
    return None


def _checks_of(plan: Plan, numbers: Sequence[int]) -> list[Check]:
    """The checks of these groups, in the request's order."""
    return [plan.checks[i] for i in sorted(i for n in numbers for i in plan.groups[n])]


def _locally(
    plan: Plan, replies: Sequence[object], lost: Sequence[Check], dry_run: bool
) -> tuple[list[Result] | None, bool]:
    """The local fallback's results for the fail-open checks of the failed masters, and
    whether the request is admitted as a whole. The fallback commits only if Redis admitted
    the request in every group that answered."""
    in_redis = all(r[1] == 1 for r in replies if answered(r))  # type: ignore[index]
    if not conf.LOCAL_FALLBACK:
        return None, in_redis
    local = local_fallback.decide(lost, dry_run or not in_redis)
    for result in local:
        result.local = True  # a refund or a lease's end goes back here
    if not dry_run and metrics.switch.on:
        metrics.fallback_decided(local)
    return local, in_redis and admitted(local)


def _partly(
    plan: Plan,
    replies: list[object],
    refunded: set[int],
    local: list[Result] | None,
    retry_after: float,
    lost: Sequence[Check],
) -> StoreUnavailable:
    """A request decided partly in Redis, partly by the fail modes of fail-open rules; the
    results in the order of the checks."""
    results = assemble(plan, replies, refunded)
    if local:
        at = {(id(c.rule), c.identity): i for i, c in enumerate(plan.checks)}
        results = sorted([*results, *local], key=lambda r: at[id(r.rule), r.identity])
    return StoreUnavailable(results, retry_after, lost)


# -- async: a native asyncio Redis client per event loop ------------------------

_async_stores: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, tuple[AsyncStore, AsyncIterator[None]]
] = weakref.WeakKeyDictionary()


async def _close_with_loop(store: AsyncStore) -> AsyncIterator[None]:
    # An async generator left suspended is closed by the loop's shutdown_asyncgens()
    # (asyncio.run, and so asgiref's async_to_sync, call it before closing the loop), so
    # a short-lived loop, as async views under WSGI get, does not leak its connections.
    try:
        yield
    finally:
        await store.aclose()


async def async_store() -> AsyncStore:
    """The running event loop's asyncio store, made on first use, closed with the loop."""
    loop = asyncio.get_running_loop()
    entry = _async_stores.get(loop)
    if entry is None:
        store: AsyncStore = (
            AsyncClusterStore.from_url(conf.CLUSTER_URL)
            if conf.CLUSTER_URL
            else AsyncRedisStore.from_cache(conf.CACHE)
        )
        closer = _close_with_loop(store)
        await closer.__anext__()
        entry = _async_stores[loop] = (store, closer)
    return entry[0]


def reset_fallback() -> None:
    """Forget async clients, the breaker's state and the local fallback's counters, and read
    METRICS again."""
    _async_stores.clear()
    breaker.reset()
    node_breakers.reset()
    local_fallback.clear()
    breaker_moved()


async def adecide_guarded(
    store_of: Callable[[], Store], checks: Sequence[Check], dry_run: bool
) -> list[Result] | StoreUnavailable:
    if not conf.uses_redis:
        return decide_guarded(store_of, checks, dry_run)
    token = breaker.allow()
    if token is None:
        return _unavailable(checks, dry_run)
    timed = metrics.switch.on
    start = time.perf_counter() if timed else 0.0
    try:
        try:
            store = await async_store()
            if isinstance(store, AsyncClusterStore):
                results = await _aon_cluster(store, checks, dry_run)
            else:
                results = await store.decide(checks, dry_run)
        finally:
            if timed:
                metrics.store_timed(time.perf_counter() - start)
    except TryAgainError:
        return _unavailable(checks, dry_run)
    except STORE_ERRORS as exc:
        breaker.failed(exc, token)
        breaker_moved()
        return _unavailable(checks, dry_run)
    except BaseException:
        # CancelledError: the client went away (Django cancels the view) or a timeout
        # cancelled the task while it waited on Redis.
        breaker.abandoned(token)
        raise
    if breaker.state != CLOSED:
        breaker.succeeded(token)
        breaker_moved()
    return results
