"""``GuardedStore``: the store as callers see it, every call behind its breaker and fail modes;
it owns the backends, the breakers and the local fallback, so no caller touches a client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from redis.exceptions import ConnectionError, TryAgainError

from .. import metrics
from ..compiled import CompiledRule
from ..conf import conf
from ..runtime import current
from ..state_keys import client_tag, held_key
from .base import BlockReads, Check, Result, Store, admitted
from .breaker import CLOSED, Breaker, NodeBreakers
from .cluster import AsyncClusterStore, ClusterStore, answered, slot_of_tag
from .errors import STORE_ERRORS
from .fallback import (
    StoreUnavailable,
    abandon,
    allow,
    checks_of,
    fails_closed,
    not_the_store,
    partly,
    report,
)
from .memory import MemoryStore
from .redis import HOLD_SOURCE, AsyncRedisStore, RedisStore, ask_sentinels, follow_primary
from .shared_counts import CountsLink
from .steps import Steps, adrive, drive

logger = logging.getLogger("django_throttle")

AsyncStore = AsyncRedisStore | AsyncClusterStore
# What a refund gives back: the checks of a decision at ``at`` (0: none known), made by the
# store or by the local fallback (``local``); the engine's Refund is one.
Giving = tuple[int, bool, Sequence[Check]]


def build_backend() -> Store:
    """The store the settings ask for: in memory, on a Redis Cluster or on a cache's server."""
    if not conf.uses_redis:
        return MemoryStore()
    if conf.CLUSTER_URL:
        return ClusterStore.from_url(conf.CLUSTER_URL)
    return RedisStore.from_cache(conf.CACHE)


def build_async_backend() -> AsyncStore:
    if conf.CLUSTER_URL:
        return AsyncClusterStore.from_url(conf.CLUSTER_URL)
    return AsyncRedisStore.from_cache(conf.CACHE)


class GuardedStore:
    """The process's store (a runtime part: ``runtime().part(GuardedStore)``, or ``get_store()``).

    ``decide``, ``refund`` and the hand-overs never raise for a store outage: the breakers and
    the fail modes answer instead. ``inspect``, ``reset`` and ``server_time`` raise the
    store's errors, for their callers to show."""

    def __init__(self) -> None:
        interval = self._interval
        self.breaker = Breaker(interval)
        self.node_breakers = NodeBreakers(interval)  # a cluster's masters, by address
        self.local_fallback = MemoryStore()
        self.blocks = BlockReads()  # every backend's: which block keys decisions read
        self._backend: Store | None = None
        self._lock = threading.Lock()
        self._async: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[AsyncStore, AsyncIterator[None]]
        ] = weakref.WeakKeyDictionary()
        self._dropping = False  # a refund failed and no store call has worked since: said once
        # This runtime's switch, read on every decision without a lookup.
        self._metrics = current.runtime.part(metrics.Metrics)
        # conf.uses_redis, read on every async decision: BACKEND, CLUSTER_URL and CACHES
        # cannot change under this runtime (a change replaces it, and this store with it).
        self._uses_redis = conf.uses_redis
        self._moved()

    @staticmethod
    def _interval() -> float:
        return conf.BREAKER_INTERVAL

    # -- the backends ---------------------------------------------------------------------

    def backend(self) -> Store:
        """The sync backend, built on first use (building may fail: a store error)."""
        store = self._backend
        if store is None:
            with self._lock:
                if self._backend is None:
                    self._backend = self._adopt(build_backend())
                store = self._backend
        return store

    def use(self, backend: Store | None) -> None:
        """Decide on ``backend`` instead of the one the settings make (None: that one again, at
        next use), for tests and benchmarks that build their own; never closes the one left."""
        with self._lock:
            self._backend = None if backend is None else self._adopt(backend)

    def _adopt(self, store: Any) -> Any:
        if isinstance(store, (ClusterStore, AsyncClusterStore)):
            store.node_breakers = self.node_breakers
        if hasattr(store, "blocks"):
            self.blocks.every = self.blocks.every or store.blocks.every
            store.blocks = self.blocks
        return store

    async def async_backend(self) -> AsyncStore:
        """The running event loop's asyncio backend, made on first use, closed with the loop."""
        loop = asyncio.get_running_loop()
        entry = self._async.get(loop)
        if entry is None:
            store: AsyncStore = self._adopt(build_async_backend())
            if isinstance(store, AsyncRedisStore):
                with contextlib.suppress(Exception):  # no sync store: nothing to follow
                    follow_primary(store, self.backend())
            closer = _close_with_loop(store)
            await closer.__anext__()
            entry = self._async[loop] = (store, closer)
        return entry[0]

    def close(self) -> None:
        """Close the sync backend's connections and drop each event loop's store: on a loop
        that runs (a server's), asyncio's async-generator finalizer closes it at once."""
        with self._lock:
            store, self._backend = self._backend, None
        self._async.clear()
        close = getattr(store, "close", None)
        if close is not None:
            close()

    # -- decisions --------------------------------------------------------------------------

    def decide(
        self, checks: Sequence[Check], dry_run: bool = False
    ) -> list[Result] | StoreUnavailable:
        """The store's decision, or what the fail modes make of the checks it could not decide.
        On a cluster the breaker guards reading the slot map; each master's, its slot groups."""
        breaker = self.breaker
        # Closed (nearly always): the token without a call.
        token = breaker.epoch if breaker.state == CLOSED else breaker.allow()
        if token is None:
            return self._unavailable(checks, dry_run)
        start = time.perf_counter() if self._metrics.on else 0.0
        try:
            store = self._backend  # an empty MemoryStore is falsy: no `or`
            if store is None:
                store = self.backend()
            if isinstance(store, ClusterStore):
                results = drive(self._on_cluster(store, checks, dry_run))
            else:
                results = store.decide(checks, dry_run)
        except BaseException as exc:
            return self._failed(exc, token, checks, dry_run, start)
        return self._decided(token, results, start)

    async def adecide(
        self, checks: Sequence[Check], dry_run: bool = False
    ) -> list[Result] | StoreUnavailable:
        """decide() on the event loop's asyncio backend."""
        if not self._uses_redis:
            return self.decide(checks, dry_run)
        breaker = self.breaker
        token = breaker.epoch if breaker.state == CLOSED else breaker.allow()
        start = time.perf_counter() if self._metrics.on else 0.0
        if token is None:
            return self._unavailable(checks, dry_run)
        try:
            entry = self._async.get(asyncio.get_running_loop())
            store = entry[0] if entry is not None else await self.async_backend()
            if isinstance(store, AsyncClusterStore):
                results = await adrive(self._on_cluster(store, checks, dry_run))
            else:
                results = await store.decide(checks, dry_run)
        except BaseException as exc:
            # CancelledError: the client went away (Django cancels the view) or a timeout
            # cancelled the task while it waited on Redis.
            return self._failed(exc, token, checks, dry_run, start)
        return self._decided(token, results, start)

    def _on_cluster(
        self, store: ClusterStore | AsyncClusterStore, checks: Sequence[Check], dry_run: bool
    ) -> Steps[list[Result] | StoreUnavailable]:
        """A decision on a cluster, each slot group behind its master's breaker (steps for
        drive() and adrive()). Raises only what concerns the whole cluster (its slot map
        cannot be read) or no store at all."""
        plan = yield store.plan, (checks,)
        guards = [self.node_breakers.of(node) for node in plan.nodes]
        tokens = allow(guards)
        try:
            replies = yield store.send, (plan, dry_run, tokens)
        except BaseException:
            abandon(guards, tokens)  # interrupted: no verdict on any node
            raise
        failed, moved = report(guards, tokens, replies)
        if moved:
            self._moved()
        if not failed:
            return (yield store.settle, (plan, replies, dry_run))  # type: ignore[no-any-return]
        error = not_the_store(replies)
        if error is not None:
            if not dry_run:
                yield store.refund_committed, (plan, replies)
            raise error
        retry_after = max(guards[n].retry_after for n in failed)
        lost = checks_of(plan, failed)
        if len(failed) == len(replies) or any(fails_closed(c.rule) for c in lost):
            # Refused as a whole (or nothing answered): what the answered groups took goes back.
            if not dry_run:
                yield store.refund_committed, (plan, replies)
            return self._unavailable(lost, dry_run, retry_after)
        # The local fallback decides the fail-open checks of the failed masters; it commits
        # only if Redis admitted the request in every group that answered.
        in_redis = all(r[1] == 1 for r in replies if answered(r))
        local, admit = None, in_redis
        if conf.LOCAL_FALLBACK:
            local = self.fall_back(lost, dry_run, commit=in_redis)
            admit = in_redis and admitted(local)
        refunded = set()
        if not admit and not dry_run:
            refunded = yield store.refund_committed, (plan, replies)
        return partly(plan, replies, refunded, local, retry_after, lost)

    def _decided(
        self, token: int, results: list[Result] | StoreUnavailable, start: float
    ) -> list[Result] | StoreUnavailable:
        """A decision the store made: timed (``start``: 0.0 when metrics are off), and the
        breaker closed if this call was its probe."""
        if start:
            metrics.store_observed(self._metrics, time.perf_counter() - start)
        breaker = self.breaker
        if breaker.state != CLOSED:
            self._succeeded(breaker, token)
        return results

    def _failed(
        self,
        exc: BaseException,
        token: int,
        checks: Sequence[Check],
        dry_run: bool,
        start: float = 0.0,
    ) -> StoreUnavailable:
        """The fail modes after a store call raised ``exc``; raises it if it is not the store's.
        Called from the ``except`` clause that caught it (``start``: as _decided())."""
        if start:
            metrics.store_observed(self._metrics, time.perf_counter() - start)
        if isinstance(exc, TryAgainError):
            return self._unavailable(checks, dry_run)  # a slot migrating: this request only
        if isinstance(exc, STORE_ERRORS):
            self.breaker.failed(exc, token)
            self._moved()
            return self._unavailable(checks, dry_run)
        self.breaker.abandoned(token)  # interrupted: no verdict on the store, never a stuck probe
        raise  # noqa: PLE0704 -- the exception being handled by the caller

    def _succeeded(self, breaker: Breaker, token: int) -> None:
        breaker.succeeded(token)
        self._moved()

    def _unavailable(
        self, checks: Sequence[Check], dry_run: bool, retry_after: float | None = None
    ) -> StoreUnavailable:
        results = None
        if conf.LOCAL_FALLBACK:
            open_checks = [c for c in checks if not fails_closed(c.rule)]
            if open_checks:
                results = self.fall_back(open_checks, dry_run)
        if retry_after is None:
            retry_after = self.breaker.retry_after
        return StoreUnavailable(results, retry_after, checks)

    def fall_back(
        self, checks: Sequence[Check], dry_run: bool, commit: bool = True
    ) -> list[Result]:
        """The local fallback's decision, committed unless a dry run or not ``commit`` (counted
        on the metrics unless a dry run)."""
        results = self.local_fallback.decide(checks, dry_run or not commit)
        for result in results:
            result.local = True  # a refund or a lease's end goes back here
        if not dry_run and self._metrics.on:
            metrics.fallback_decided(results)
        return results

    def _moved(self) -> None:
        """Show the breakers' state on the store_available gauge (0 while any is open)."""
        if self._metrics.on:
            breaker, nodes = self.breaker, self.node_breakers
            metrics.store_state(lambda: breaker.state == CLOSED and nodes.all_closed())

    # -- refunds ----------------------------------------------------------------------------

    def refund(self, refunds: Iterable[Giving]) -> None:
        """Give back what these decisions took where they were made. A refund the store cannot
        take is logged (once per outage) and dropped, never raised."""
        remote = self._give_back_locally(refunds)
        if remote:
            drive(self._refund_steps(remote), self.backend)

    async def arefund(self, refunds: Iterable[Giving]) -> None:
        """refund() on the event loop's asyncio backend."""
        if not conf.uses_redis:
            self.refund(refunds)
            return
        remote = self._give_back_locally(refunds)
        if remote:
            await adrive(self._refund_steps(remote), self.async_backend)

    def _give_back_locally(self, refunds: Iterable[Giving]) -> list[Giving]:
        """Give back the local fallback's refunds now; return the store's."""
        remote = []
        for refund in refunds:
            at, local, checks = refund
            if local:
                self.local_fallback.refund(checks, at)
            elif checks:
                remote.append(refund)
        return remote

    def _refund_steps(self, remote: Sequence[Giving]) -> Steps[None]:
        """The refund.lua calls of these refunds, each master's part behind its breaker on a
        cluster (steps for drive() and adrive(): the backend first)."""
        with self._guarded(self.breaker) as allowed:
            if allowed:
                store = yield None, ()  # the backend (drive()'s backend_of)
                for at, _, checks in remote:
                    for guard, group in self._by_node(store, checks):
                        if guard is None:
                            yield store.refund, (group, at)
                            continue
                        with self._guarded(guard) as node_allowed:
                            if node_allowed:
                                yield store.refund, (group, at)

    @contextmanager
    def _guarded(self, breaker: Breaker) -> Iterator[bool]:
        """A breaker around the store calls of a refund (the store's, or on a cluster a
        master's): whether they may be made; a store error is reported to it and the refund
        dropped, never raised."""
        token = breaker.allow()
        if token is None:
            self._dropped("the store is unavailable")
            yield False
            return
        try:
            yield True
        except TryAgainError as exc:
            self._dropped(repr(exc))  # a slot migrating: this refund only, not an outage
            return
        except STORE_ERRORS as exc:
            breaker.failed(exc, token)
            self._moved()
            self._dropped(repr(exc))
            return
        except BaseException:
            breaker.abandoned(token)
            raise
        if breaker.state != CLOSED:  # this call may be the probe that closes the breaker
            self._succeeded(breaker, token)
        self._dropping = False

    def _dropped(self, why: str) -> None:
        if self._dropping:
            return
        self._dropping = True
        logger.warning(
            "django_throttle: a refund could not be made (%s); what it would give back stays "
            "counted until its window or lease ends (said once until refunds work again)",
            why,
        )

    def _by_node(
        self, store: object, checks: Sequence[Check]
    ) -> list[tuple[Breaker | None, Sequence[Check]]]:
        """The checks by the breaker of the master that holds them, on a cluster; elsewhere
        one group with None (the store's one breaker covers them)."""
        if not isinstance(store, (ClusterStore, AsyncClusterStore)):
            return [(None, checks)]
        groups: dict[str | None, list[Check]] = {}
        for check in checks:
            node = store.node_of_slot(slot_of_tag(client_tag(check.identity)))
            groups.setdefault(node, []).append(check)
        breakers = self.node_breakers
        return [(None if n is None else breakers.of(n), group) for n, group in groups.items()]

    # -- what the dashboard and the commands ask -----------------------------------------

    def inspect(self, checks: Sequence[Check]) -> list[Result]:
        """The state of these checks, consuming nothing; raises the store's errors."""
        return self.backend().decide(checks, dry_run=True) if checks else []

    def block_levels(self, checks: Sequence[Check]) -> list[int]:
        """How many blocks each check's growing rule has given its client while remembered
        (the dashboard's key page); raises the store's errors."""
        return self.backend().block_levels(checks) if checks else []

    def reset(self, rule: CompiledRule, identity: str) -> None:
        """Forget the state of one client under one rule; raises the store's errors."""
        self.backend().reset(rule, identity)

    def block(self, checks: Sequence[Check], seconds: int) -> None:
        """Reject each check's client under its rule for ``seconds`` (block.lua: atomically; on
        a cluster, per slot group), behind the breaker; raises the store's errors (while the
        breaker is open, without a call)."""
        if not checks:
            return
        breaker = self.breaker
        token = breaker.allow()
        if token is None:
            raise ConnectionError("the store is unavailable (circuit breaker open)")
        try:
            store = self.backend()
            if conf.uses_redis:
                # First: while it lives, every process's decisions read the block keys.
                # EVALSHA (what the ACL of docs/deploying.md allows), loaded on NOSCRIPT.
                client = self._client()
                client.register_script(HOLD_SOURCE)(keys=[held_key()], args=[seconds * 1000])
            store.block(checks, seconds)
        except TryAgainError:
            breaker.abandoned(token)  # a slot migrating: not an outage
            raise
        except STORE_ERRORS as exc:
            breaker.failed(exc, token)
            self._moved()
            raise
        except BaseException:
            breaker.abandoned(token)
            raise
        if breaker.state != CLOSED:
            self._succeeded(breaker, token)

    def server_time(self) -> float:
        """The store's clock (Redis TIME), in Unix seconds; raises if it cannot be read."""
        seconds, micros = self._client().time()
        return int(seconds) + int(micros) / 1e6

    # -- the rules version and the rejection log's hand-over ------------------------------

    def read_tokens(self, key: str, other: str, held: str | None = None) -> tuple[Any, Any]:
        """Two keys of one slot in one round trip; ConnectionError, without a call, while a
        breaker says the store (on a cluster: their master) failed moments ago. ``held``, a
        third key of that slot read with them, tells whether blocks written by ``block()`` may
        live (``held_key()``): decisions read every rule's block keys while it does."""
        self._refuse_while_open(key)
        ask_sentinels(self._client())
        if held is None:
            first, second = self._client().mget([key, other])
        else:
            first, second, live = self._client().mget([key, other, held])
            self.blocks.every = live is not None
        return first, second

    def write_token(self, key: str, value: str, ttl: int, unless_open: bool = False) -> None:
        """Set ``key`` for ``ttl`` seconds; ``unless_open``: ConnectionError instead while a
        breaker says the store failed moments ago."""
        if unless_open:
            self._refuse_while_open(key)
        self._client().set(key, value, ex=ttl)

    def counts_link(self, key: str) -> CountsLink | None:
        """Where the rejection log hands its counts on (``key``: its counts), or None when
        counts stay in the process (the memory backend), the store cannot be built, or a
        breaker says Redis (on a cluster: the master of ``key``) failed moments ago."""
        if not conf.uses_redis or self.breaker.is_open():
            return None
        try:
            store = self.backend()
        except Exception:  # settings the system checks report; recording must not raise
            return None
        if self._node_open(store, key):
            return None
        client = getattr(store, "client", None)
        return None if client is None else CountsLink(client)

    def _client(self) -> Any:
        # The decision client, with the decision timeouts rather than the cache's (seconds, or
        # none): a hung server must not hold a request.
        return self.backend().client  # type: ignore[attr-defined]

    def _refuse_while_open(self, key: str) -> None:
        if self.breaker.is_open() or self._node_open(self.backend(), key):
            raise ConnectionError("the store is unavailable (circuit breaker open)")

    def _node_open(self, store: object, key: str) -> bool:
        """Whether, on a cluster, the breaker of the master that holds ``key`` says it failed
        moments ago (outside a cluster, the store's one breaker says it)."""
        if not isinstance(store, (ClusterStore, AsyncClusterStore)):
            return False
        node = store.node_of_key(key)
        return node is not None and self.node_breakers.is_open(node)


async def _close_with_loop(store: AsyncStore) -> AsyncIterator[None]:
    # An async generator left suspended is closed by the loop's shutdown_asyncgens()
    # (asyncio.run, and so asgiref's async_to_sync, call it before closing the loop), so
    # a short-lived loop, as async views under WSGI get, does not leak its connections.
    try:
        yield
    finally:
        await store.aclose()
