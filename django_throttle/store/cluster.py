"""Decisions on a Redis Cluster (``CLUSTER_URL``): a request's checks by slot group, all sent
before any reply is read, all or nothing across groups (docs/deploying.md, "Redis Cluster").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from binascii import crc_hqx
from collections.abc import Iterator, Sequence
from inspect import signature
from typing import Any

from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)

from ..compiled import CompiledRule
from ..conf import conf
from ..state_keys import BLOCK_SUFFIX, client_tag
from .aio_connection import AsyncStack, acall_any, async_stack
from .base import BlockReads, Check, Result, client_keys, level_key, levels
from .breaker import NodeBreakers
from .connections import ConnectionStack, as_eval, call, keeps, recovered
from .errors import STORE_ERRORS
from .redis import (
    BLOCK_SHA,
    BLOCK_SOURCE,
    CLOCK_MISS,
    DECIDE_SHA,
    DECIDE_SOURCE,
    REFUND_SHA,
    REFUND_SOURCE,
    REPLY_FIELDS,
    CalendarMissError,
    ServerClock,
    block_input,
    decide_input,
    decision_kwargs,
    no_async_retry,
    parse_reply,
    refund_input,
    unpacked,
    untyped,
)
from .server_timed import plain_options, time_by_server
from .steps import Steps, adrive, drive

logger = logging.getLogger("django_throttle")

SLOTS = 16384
# Redirections one script call follows: a failover takes one, a slot map in flux a few more.
REDIRECTIONS = 5
# When they do not settle (the nodes still disagree: gossip has not yet carried a failover to
# all of them), the pauses before the slot map is read again and the call sent once more.
SETTLE_PAUSES = (0.02, 0.04)
PRIMARY, REPLICA = "primary", "replica"  # redis-py's server types of a node


# Replies that send a call elsewhere: MOVED (an AskError), ASK, and CLUSTERDOWN from a node
# that has not yet settled a failover.
REDIRECTIONS_OF = (AskError, ClusterDownError)


_UNSETTLED = object()  # _follow(): the redirections did not settle


class Unsettled(TryAgainError):
    """Redirections that did not settle within REDIRECTIONS (nodes disagreeing on a slot while
    the cluster changes): like TRYAGAIN, this request only, never a node's failure."""


def _breaker_interval() -> float:
    return conf.BREAKER_INTERVAL


def slot_of_tag(tag: str) -> int:
    """The cluster slot of every key carrying this hash tag (``{...}``)."""
    return crc_hqx(tag[1:-1].encode("ascii"), 0) % SLOTS


def group_by_slot(checks: Sequence[Check]) -> dict[int, list[int]]:
    """Indices of the checks, by the slot of their state keys, in the order given."""
    groups: dict[int, list[int]] = {}
    slots: dict[str, int] = {}
    for i, check in enumerate(checks):
        slot = slots.get(check.identity)
        if slot is None:
            slot = slots[check.identity] = slot_of_tag(client_tag(check.identity))
        groups.setdefault(slot, []).append(i)
    return groups


class Plan:
    """A request's checks by slot group: each group's slot, check indices and master."""

    __slots__ = ("checks", "groups", "nodes", "slots")

    def __init__(
        self, checks: Sequence[Check], slots: list[int], groups: list[list[int]], nodes: list[str]
    ) -> None:
        self.checks = checks
        self.slots = slots
        self.groups = groups
        self.nodes = nodes  # the address of each group's master ("host:port")

    def group(self, number: int) -> Sequence[Check]:
        if len(self.groups) == 1:
            return self.checks
        return [self.checks[i] for i in self.groups[number]]


def master_of(manager: Any, slot: int) -> Any:
    """The slot's master in redis-py's slot map. Read from the map itself: redis-py's
    get_node_from_slot() takes a lock and goes through a deprecation wrapper, several
    microseconds a call, and a decision asks twice."""
    nodes = manager.slots_cache.get(slot)
    if not nodes:
        return manager.get_node_from_slot(slot)  # raises SlotNotCoveredError
    return nodes[0]


def _plan(manager: Any, checks: Sequence[Check]) -> Plan:
    by_slot = group_by_slot(checks)
    slots = list(by_slot)
    nodes = [master_of(manager, slot).name for slot in slots]
    return Plan(checks, slots, list(by_slot.values()), nodes)


def _numbers(plan: Plan, tokens: Sequence[int | None] | None) -> list[int]:
    """The groups to send: those whose token is not None (all without tokens)."""
    if tokens is None:
        return list(range(len(plan.slots)))
    return [n for n, token in enumerate(tokens) if token is not None]


def _node_of_slot(manager: Any, slot: int) -> str | None:
    try:
        return str(master_of(manager, slot).name)
    except Exception:  # no slot map yet, or the slot not served
        return None


def _refresh_kwargs(manager: Any, node: str | None) -> dict[str, Any]:
    """initialize()'s arguments to ask the node that just failed for the slot map last (a
    hung node would hold the refresh for a whole timeout); redis-py 5 has no such argument."""
    if node is None or "last_failed_node_name" not in signature(manager.initialize).parameters:
        return {}
    return {"last_failed_node_name": node}


def _take_over(manager: Any, slot: int, node: Any) -> None:
    """The slot map after MOVED to ``node``: a replica of the slot's master that took over
    takes its master's place, in the list of nodes that redis-py's map shares between the
    slots of one range (so that range moves at once); another node takes this slot only."""
    nodes = manager.slots_cache.get(slot)
    if nodes and nodes[0].name == node.name:
        return
    if nodes and node.name in (n.name for n in nodes[1:]):
        old = nodes[0]
        # One assignment: a thread reading the map meanwhile sees the old list or the new.
        nodes[:] = [node, *(n for n in nodes[1:] if n.name != node.name), old]
        node.server_type, old.server_type = PRIMARY, REPLICA
    else:
        manager.slots_cache[slot] = [node]


def _owner_in(cluster_slots: Any, slot: int) -> tuple[str, int] | None:
    """The (host, port) of the slot's master in a CLUSTER SLOTS reply; host "" if unknown."""
    for entry in cluster_slots:
        if int(entry[0]) <= slot <= int(entry[1]):
            host = entry[2][0]
            host = host.decode() if isinstance(host, bytes) else str(host or "")
            return host, int(entry[2][1])
    return None


def _still_missed(reply: Any) -> Any:
    """A group's reply sent again after a calendar miss, or the error if it missed again."""
    if not isinstance(reply, BaseException) and reply[1] == CLOCK_MISS:
        return CalendarMissError()
    return reply


def _to_refund(checks: Sequence[Check], indices: list[int], reply: Sequence[int]) -> list[Check]:
    """The checks of a committed group that decide.lua did commit: those that admitted, and
    a log-only window counted past its limit (negative remaining); another shadow rule that
    rejected is in an admitted group uncounted."""
    return [
        checks[i]
        for k, i in enumerate(indices)
        if reply[2 + REPLY_FIELDS * k] == 1 or reply[3 + REPLY_FIELDS * k] < 0
    ]


def _without_block_keys(args: list[Any]) -> list[Any]:
    """decide.lua's input with each block key replaced by its state key, for a slot's new
    master while the slot migrates: there a call with a key it does not hold yet besides
    another is refused (TRYAGAIN), one key named twice is not; the request is decided
    without blocks (as the local fallback would), rather than not at all."""
    count = args[0]
    keys = list(args[1 : 1 + count])
    for i, key in enumerate(keys):
        if isinstance(key, str) and key.endswith(BLOCK_SUFFIX):
            keys[i] = keys[i - 1]  # a block key follows its state key
    return [count, *keys, *args[1 + count :]]


def answered(reply: Any) -> bool:
    """Whether a group's reply is decide.lua's (not an error, not kept back)."""
    return reply is not None and not isinstance(reply, BaseException)


def assemble(plan: Plan, replies: Sequence[Any], refunded: set[int]) -> list[Result]:
    """The results of the groups that answered, in the order of the checks."""
    checks = plan.checks
    results: list[Result | None] = [None] * len(checks)
    for number, (indices, reply) in enumerate(zip(plan.groups, replies, strict=True)):
        if not answered(reply):
            continue
        parsed = parse_reply([checks[i] for i in indices], reply)
        for i, result in zip(indices, parsed, strict=True):
            if number in refunded and result.allowed:
                # As if never committed, as decide.lua reports a rejected request.
                rule = result.rule
                result.remaining = min(
                    result.remaining + checks[i].cost, max(rule.limit, rule.burst)
                )
            elif number in refunded:
                result.past = 0  # given back with the rest of its group
            results[i] = result
    return [r for r in results if r is not None]


def _first_error(replies: Sequence[Any]) -> BaseException | None:
    return next((r for r in replies if isinstance(r, BaseException)), None)


def _to_give_back(plan: Plan, replies: Sequence[Any]) -> list[tuple[int, list[Check], int]]:
    """(group, checks, time) of every group that committed: decide.lua admitted it."""
    return [
        (number, _to_refund(plan.checks, plan.groups[number], reply), int(reply[0]))
        for number, reply in enumerate(replies)
        if answered(reply) and reply[1] == 1
    ]


class _Cluster:
    """What the sync and the asyncio cluster stores share: the slot map's masters, what a
    failure says of it, and the steps (store/steps.py) of a redirection, of a request's
    settling and of a refund, which each store drives with its own I/O."""

    _call: Any  # connections.call or acall: one command on a connection
    _pause: Any  # time.sleep or asyncio.sleep
    _stacks: dict[str, Any]

    def __init__(self, client: Any) -> None:
        self.client = client  # reset, the rules version, the slot map
        # The masters' breakers (GuardedStore gives its own, shared with each loop's store):
        # those of the nodes a slot map no longer names are forgotten when it is read.
        self.node_breakers = NodeBreakers(_breaker_interval)
        self._stacks = {}
        self._ready = True  # whether the slot map was read once (redis.asyncio reads it late)
        self._stale = False
        self._suspect: str | None = None  # the node whose failure made the slot map stale
        self.clock = ServerClock()
        self.blocks = BlockReads()  # the guarded store's own, once adopted

    def node_of_slot(self, slot: int) -> str | None:
        """The address of the slot's master, as the slot map last read says; None if unknown."""
        return _node_of_slot(self.client.nodes_manager, slot)

    def node_of_key(self, key: str) -> str | None:
        return self.node_of_slot(key_slot(key.encode("utf-8")))

    def _stack(self, node: Any) -> Any:
        raise NotImplementedError

    def _refresh(self) -> Any:
        raise NotImplementedError

    @contextlib.contextmanager
    def _refreshing(self) -> Iterator[None]:
        """Around reading the slot map (each store's _refresh): stale until it is read, then
        the breakers of the nodes it names kept."""
        self._stale = False
        try:
            yield
        except BaseException:
            self._stale = True
            raise
        self._suspect = None
        self.node_breakers.keep(self.client.nodes_manager.nodes_cache)

    def _failed(self, exc: BaseException, slot: int) -> None:
        if not isinstance(exc, ResponseError) or not keeps(exc):
            self._stale = True  # a node gone or demoted: read the slot map before next time
            self._suspect = self.node_of_slot(slot)

    def _redirected(
        self,
        exc: AskError | ClusterDownError,
        slot: int,
        sha: str,
        source: str,
        args: list[Any],
        node: str | None,
    ) -> Steps[Any]:
        """A script call after a redirection from ``node``, sent where the reply says, as
        redis-py's cluster client does: ``MOVED``, to the slot's new master, which the slot
        map then names (the whole map is read again before the next request); ``ASK``, with
        ``ASKING``; ``CLUSTERDOWN`` (a node that has not settled a failover yet), to the
        slot's master as another node's map names it. A redirection is the cluster's answer,
        not a failure: ``Unsettled`` if they do not settle."""
        manager = self.client.nodes_manager
        redirecting = {node}  # the nodes that sent this call elsewhere
        for pause in (0.0, *SETTLE_PAUSES):
            if pause:
                # Still unsettled: a moment for the cluster's gossip, then the slot's master
                # as a map read now names it.
                yield self._pause, (pause,)
                yield self._refresh, ()
                try:
                    target = master_of(manager, slot)
                except SlotNotCoveredError:
                    continue
                try:
                    return (yield from self._script_on(target, sha, source, args, asking=False))
                except REDIRECTIONS_OF as again:
                    redirecting = {target.name}
                    exc = again
            result = yield from self._follow(exc, slot, sha, source, args, redirecting)
            if result is not _UNSETTLED:
                return result
        raise untyped(Unsettled)(f"the cluster's redirections did not settle ({exc})") from exc

    def _follow(
        self,
        exc: AskError | ClusterDownError,
        slot: int,
        sha: str,
        source: str,
        args: list[Any],
        redirecting: set[str | None],
    ) -> Steps[Any]:
        """_redirected()'s redirections, at most REDIRECTIONS: the reply, or _UNSETTLED."""
        manager = self.client.nodes_manager
        for _ in range(REDIRECTIONS):
            if isinstance(exc, ClusterDownError):
                owner = yield from self._owner_elsewhere(slot, redirecting)
                if owner is None:
                    break
                self._stale = True
                try:
                    return (yield from self._script_on(owner, sha, source, args, asking=False))
                except REDIRECTIONS_OF as again:
                    redirecting.add(owner.name)
                    exc = again
                continue
            moved = isinstance(exc, MovedError)
            target = manager.get_node(host=exc.host, port=exc.port)
            if target is None:  # a node added since the map was read
                yield self._refresh, ()
                target = manager.get_node(host=exc.host, port=exc.port)
                if target is None:
                    break
            if moved:
                if target.name in redirecting:
                    # Sent back: the two disagree (one has not yet learnt of a failover
                    # that the other has), so a third says who serves the slot.
                    target = yield from self._owner_elsewhere(slot, redirecting)
                    if target is None:
                        break
                _take_over(manager, slot, target)
                # The other slots of the old master may have moved too; a node that has not
                # learnt of it yet may answer this read, and its map is followed the same way.
                self._stale = True
            elif sha == DECIDE_SHA:
                args = _without_block_keys(args)
            try:
                return (yield from self._script_on(target, sha, source, args, asking=not moved))
            except REDIRECTIONS_OF as again:
                redirecting.add(target.name)
                exc = again
        return _UNSETTLED

    def _script_on(
        self, node: Any, sha: str, source: str, args: list[Any], asking: bool
    ) -> Steps[Any]:
        """A script call on ``node``, run from its source if the node lacks it (a new master
        after a failover may), as every stack does (connections.reloaded()); ``asking``: each
        command after ASKING, which holds for one command."""
        stack = self._stack(node)
        conn = yield stack.take, ()
        command = ("EVALSHA", sha, *args)
        try:
            try:
                if asking:
                    yield self._call, (conn, ("ASKING",))
                reply = yield self._call, (conn, command)
            except NoScriptError:
                try:
                    if asking:
                        yield self._call, (conn, ("ASKING",))
                    reply = yield self._call, (conn, as_eval(command, source))
                except NoPermissionError:  # an ACL without +eval: loaded, then run
                    yield self._call, (conn, ("SCRIPT", "LOAD", source))
                    if asking:
                        yield self._call, (conn, ("ASKING",))
                    reply = yield self._call, (conn, command)
        except ResponseError as error:
            yield stack.settle, (conn, error)
            raise
        except BaseException as error:
            yield stack.lost, (conn, error)
            raise
        stack.give(conn)
        return reply

    def _owner_elsewhere(self, slot: int, redirecting: set[str | None]) -> Steps[Any]:
        """The slot's master as the first node that answers, among those that did not
        redirect this call, says (CLUSTER SLOTS); None if none does."""
        manager = self.client.nodes_manager
        for node in list(manager.nodes_cache.values()):
            if node.name in redirecting:
                continue
            try:
                reply = yield self._stack(node).execute, ("CLUSTER", "SLOTS")
            except STORE_ERRORS:
                continue  # down or hung: another may answer
            owner = _owner_in(reply, slot)
            if owner is None:
                continue
            found = manager.get_node(host=owner[0] or node.host, port=owner[1])
            if found is not None:
                return found
        return None

    def _settling(self, plan: Plan, replies: list[Any], dry_run: bool) -> Steps[list[Result]]:
        """The results of a request every group answered (or raise the first group's error),
        after refunding the groups that committed a request not admitted as a whole."""
        if len(replies) == 1:
            (reply,) = replies
            if isinstance(reply, BaseException):
                raise reply
            return parse_reply(plan.checks, reply)
        error = _first_error(replies)
        rejected = error is not None or any(r[1] == 0 for r in replies)
        refunded: set[int] = set()
        if rejected and not dry_run:
            refunded = yield self.refund_committed, (plan, replies)  # type: ignore[attr-defined]
        if error is not None:
            raise error
        return assemble(plan, replies, refunded)


class ClusterStore(_Cluster):
    """Decisions on a Redis Cluster, through redis-py's RedisCluster for the slot map."""

    _call = staticmethod(call)
    _pause = staticmethod(time.sleep)
    _stacks: dict[str, ConnectionStack]

    @classmethod
    def from_url(cls, url: str) -> ClusterStore:
        from redis.cluster import RedisCluster

        return cls(untyped(RedisCluster.from_url)(url, **decision_kwargs()))

    def close(self) -> None:
        stacks, self._stacks = list(self._stacks.values()), {}
        for stack in stacks:
            stack.close()
        self.client.close()

    def _refresh(self) -> None:
        with self._refreshing():
            manager = self.client.nodes_manager
            manager.initialize(**_refresh_kwargs(manager, self._suspect))

    def _stack(self, node: Any) -> ConnectionStack:
        # By address: a refreshed slot map may bring new node objects for the same server.
        stack = self._stacks.get(node.name)
        if stack is None:
            # Its connections are written and read by this store, through redis-py.
            pool = node.redis_connection.connection_pool
            stack = ConnectionStack(pool, direct_reads=False, **decision_kwargs())
            stack = self._stacks.setdefault(node.name, stack)
        return stack

    def _run(self, slot: int, sha: str, source: str, args: list[Any]) -> Any:
        """One script call on the slot's master, following its redirections."""
        try:
            node = master_of(self.client.nodes_manager, slot)
            try:
                return self._stack(node).run_script(sha, source, *args)
            except REDIRECTIONS_OF as exc:
                return drive(self._redirected(exc, slot, sha, source, args, node.name))
        except BaseException as exc:
            self._failed(exc, slot)
            raise

    def decide(self, checks: Sequence[Check], dry_run: bool = False) -> list[Result]:
        if not checks:
            return []
        plan = self.plan(checks)
        return self.settle(plan, self.send(plan, dry_run), dry_run)

    def plan(self, checks: Sequence[Check]) -> Plan:
        """The request's slot groups and their masters (the slot map read again if stale)."""
        if self._stale:
            self._refresh()
        return _plan(self.client.nodes_manager, checks)

    def send(
        self, plan: Plan, dry_run: bool, tokens: Sequence[int | None] | None = None
    ) -> list[Any]:
        """Each group's decide.lua reply, or the exception it ended with; None for a group not
        sent (its token is None). Every group is sent before any reply is read."""
        numbers = _numbers(plan, tokens)
        replies: list[Any] = [None] * len(plan.slots)
        if len(numbers) == 1:
            (number,) = numbers
            replies[number] = self._decide_group(plan.slots[number], plan.group(number), dry_run)
            return replies
        slots = [plan.slots[n] for n in numbers]
        inputs = [
            decide_input(plan.group(n), dry_run, self.clock, self.blocks.every) for n in numbers
        ]
        for number, reply in zip(numbers, self._concurrently(slots, inputs), strict=True):
            if not isinstance(reply, BaseException) and self.clock.missed(reply):
                reply = _still_missed(
                    self._attempt(plan.slots[number], plan.group(number), dry_run)
                )
            replies[number] = reply
        return replies

    def _attempt(self, slot: int, group: Sequence[Check], dry_run: bool) -> Any:
        """One decide.lua call for a group: its reply, or the exception it ended with."""
        try:
            return unpacked(
                self._run(
                    slot,
                    DECIDE_SHA,
                    DECIDE_SOURCE,
                    decide_input(group, dry_run, self.clock, self.blocks.every),
                )
            )
        except Exception as exc:
            return exc

    def _decide_group(self, slot: int, group: Sequence[Check], dry_run: bool) -> Any:
        reply = self._attempt(slot, group, dry_run)
        if not isinstance(reply, BaseException) and self.clock.missed(reply):
            reply = _still_missed(self._attempt(slot, group, dry_run))
        return reply

    def settle(self, plan: Plan, replies: list[Any], dry_run: bool) -> list[Result]:
        """_Cluster._settling(), driven."""
        return drive(self._settling(plan, replies, dry_run))

    def refund_committed(self, plan: Plan, replies: Sequence[Any]) -> set[int]:
        """Give back what the groups that committed took, for a request not admitted as a
        whole; the groups given back (a refund that fails is logged)."""
        refunded: set[int] = set()
        for number, group, at in _to_give_back(plan, replies):
            try:
                self._run(plan.slots[number], REFUND_SHA, REFUND_SOURCE, refund_input(group, at))
            except STORE_ERRORS as exc:
                logger.warning("django_throttle: a cross-slot refund failed (%r)", exc)
            else:
                refunded.add(number)
        return refunded

    def _concurrently(self, slots: list[int], inputs: list[list[Any]]) -> list[Any]:
        """One decide.lua call per slot group, all sent before any reply is read.

        Returns each group's reply or the exception it ended with."""
        sent: list[tuple[ConnectionStack, Any, str] | Exception] = []
        try:
            for slot, args in zip(slots, inputs, strict=True):
                sent.append(self._send(slot, args))
            return [
                self._read(slot, args, entry)
                for slot, args, entry in zip(slots, inputs, sent, strict=True)
            ]
        except BaseException:
            # Interrupted (only a BaseException gets here): a reply left unread would be
            # taken for the next decision's, so every connection still out is closed.
            for entry in sent:
                if not isinstance(entry, Exception):
                    entry[1].disconnect()
            raise

    def _send(self, slot: int, args: list[Any]) -> tuple[ConnectionStack, Any, str] | Exception:
        try:
            node = master_of(self.client.nodes_manager, slot)
            stack = self._stack(node)
            conn = stack.take()
        except Exception as exc:  # could not connect: the node may be gone
            self._failed(exc, slot)
            return exc
        try:
            conn.send_packed_command(conn.pack_command("EVALSHA", DECIDE_SHA, *args))
        except Exception as exc:
            stack.lost(conn, exc)
            self._failed(exc, slot)
            return exc
        return stack, conn, node.name

    def _read(
        self, slot: int, args: list[Any], entry: tuple[ConnectionStack, Any, str] | Exception
    ) -> Any:
        """The reply of one group sent by _send, or the exception it ended with."""
        if isinstance(entry, Exception):
            return entry
        stack, conn, node = entry
        try:
            reply = unpacked(conn.read_response())
        except NoScriptError as exc:
            # Run from its source on this same connection, one round trip, as every stack does
            # (recovered() settles the connection); a slot moved meanwhile is followed anew.
            command = ("EVALSHA", DECIDE_SHA, *args)
            try:
                return unpacked(drive(recovered(stack, conn, command, DECIDE_SOURCE, exc, True)))
            except REDIRECTIONS_OF:
                pass
            except Exception as again:
                self._failed(again, slot)
                return again
            try:
                return unpacked(self._run(slot, DECIDE_SHA, DECIDE_SOURCE, args))
            except Exception as again:
                return again
        except REDIRECTIONS_OF as exc:  # followed one by one
            stack.settle(conn, exc)
            try:
                redirected = self._redirected(exc, slot, DECIDE_SHA, DECIDE_SOURCE, args, node)
                return unpacked(drive(redirected))
            except Exception as again:
                self._failed(again, slot)
                return again
        except ResponseError as exc:
            stack.settle(conn, exc)
            self._failed(exc, slot)
            return exc
        except Exception as exc:
            stack.lost(conn, exc)
            self._failed(exc, slot)
            return exc
        stack.give(conn)
        return reply

    def reset(self, rule: CompiledRule, identity: str) -> None:
        # One slot: the client's hash tag.
        self.client.delete(*client_keys(rule, identity, self.clock.now()))

    def block_levels(self, checks: Sequence[Check]) -> list[int]:
        keys = [level_key(c.rule, c.identity) for c in checks]
        return levels(self.client.mget_nonatomic(keys))

    def refund(self, checks: Sequence[Check], at: int = 0) -> None:
        if self._stale:
            self._refresh()
        for slot, indices in group_by_slot(checks).items():
            group = [checks[i] for i in indices]
            self._run(slot, REFUND_SHA, REFUND_SOURCE, refund_input(group, at))

    def block(self, checks: Sequence[Check], seconds: int) -> None:
        """block.lua once per slot group (one client's keys: one slot)."""
        if self._stale:
            self._refresh()
        self.blocks.every = True
        for slot, indices in group_by_slot(checks).items():
            group = [checks[i] for i in indices]
            self._run(slot, BLOCK_SHA, BLOCK_SOURCE, block_input(group, seconds))


class AsyncClusterStore(_Cluster):
    """The same through redis.asyncio's RedisCluster; groups are awaited together."""

    _call = staticmethod(acall_any)
    _pause = staticmethod(asyncio.sleep)
    _stacks: dict[str, AsyncStack]

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self._ready = False

    @classmethod
    def from_url(cls, url: str) -> AsyncClusterStore:
        from redis.asyncio.cluster import RedisCluster

        kwargs = decision_kwargs()
        kwargs["retry"] = no_async_retry()
        client = RedisCluster.from_url(url, **kwargs)
        # Its own connections read the slot map: timed by the server, as the stacks are, so
        # a busy loop fails no read of it (and opens no breaker).
        time_by_server(client.nodes_manager)
        return cls(client)

    async def aclose(self) -> None:
        stacks, self._stacks = list(self._stacks.values()), {}
        for stack in stacks:
            await stack.disconnect()
        await self.client.aclose()

    async def _refresh(self) -> None:
        with self._refreshing():
            if not self._ready:
                await self.client.initialize()
                self._ready = True
            else:
                manager = self.client.nodes_manager
                await manager.initialize(**_refresh_kwargs(manager, self._suspect))

    def _stack(self, node: Any) -> AsyncStack:
        stack = self._stacks.get(node.name)
        if stack is None:
            kwargs = decision_kwargs()
            kwargs["retry"] = no_async_retry()
            # one_deadline: where redis.asyncio's connections serve (no hiredis), timed by the
            # master's answer as the lean ones are, so a busy loop opens no master's breaker.
            stack = self._stacks[node.name] = async_stack(
                plain_options(node), one_deadline=True, **kwargs
            )
        return stack

    async def _run(self, slot: int, sha: str, source: str, args: list[Any]) -> Any:
        try:
            node = master_of(self.client.nodes_manager, slot)
            try:
                return await self._stack(node).run_script(sha, source, *args)
            except REDIRECTIONS_OF as exc:
                return await adrive(self._redirected(exc, slot, sha, source, args, node.name))
        except BaseException as exc:
            self._failed(exc, slot)
            raise

    async def decide(self, checks: Sequence[Check], dry_run: bool = False) -> list[Result]:
        if not checks:
            return []
        plan = await self.plan(checks)
        return await self.settle(plan, await self.send(plan, dry_run), dry_run)

    async def plan(self, checks: Sequence[Check]) -> Plan:
        if self._stale or not self._ready:
            await self._refresh()
        return _plan(self.client.nodes_manager, checks)

    async def send(
        self, plan: Plan, dry_run: bool, tokens: Sequence[int | None] | None = None
    ) -> list[Any]:
        """ClusterStore.send(): the groups awaited together."""
        numbers = _numbers(plan, tokens)
        replies: list[Any] = [None] * len(plan.slots)
        if len(numbers) == 1:
            (number,) = numbers
            try:
                replies[number] = await self._decide_group(
                    plan.slots[number], plan.group(number), dry_run
                )
            except Exception as exc:
                replies[number] = exc
            return replies
        got = await asyncio.gather(
            *(self._decide_group(plan.slots[n], plan.group(n), dry_run) for n in numbers),
            return_exceptions=True,
        )
        for number, reply in zip(numbers, got, strict=True):
            if isinstance(reply, BaseException) and not isinstance(reply, Exception):
                raise reply  # cancelled: the others were cancelled with it
            replies[number] = reply
        return replies

    async def settle(self, plan: Plan, replies: list[Any], dry_run: bool) -> list[Result]:
        """_Cluster._settling(), driven."""
        return await adrive(self._settling(plan, replies, dry_run))

    async def refund_committed(self, plan: Plan, replies: Sequence[Any]) -> set[int]:
        """ClusterStore.refund_committed(), the refunds awaited together."""
        given = _to_give_back(plan, replies)
        refunds = [
            self._run(plan.slots[number], REFUND_SHA, REFUND_SOURCE, refund_input(group, at))
            for number, group, at in given
        ]
        # Shielded: a request cancelled now still gives back what it took.
        outcomes = await asyncio.shield(asyncio.gather(*refunds, return_exceptions=True))
        refunded: set[int] = set()
        for (number, _, _), outcome in zip(given, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                logger.warning("django_throttle: a cross-slot refund failed (%r)", outcome)
            else:
                refunded.add(number)
        return refunded

    async def _decide_group(self, slot: int, group: Sequence[Check], dry_run: bool) -> Any:
        reply = await self._decide_once(slot, group, dry_run)
        if self.clock.missed(reply):
            reply = await self._decide_once(slot, group, dry_run)
        return _still_missed(reply)

    async def _decide_once(
        self, slot: int, group: Sequence[Check], dry_run: bool
    ) -> tuple[float, ...]:
        args = decide_input(group, dry_run, self.clock, self.blocks.every)
        return unpacked(await self._run(slot, DECIDE_SHA, DECIDE_SOURCE, args))

    async def reset(self, rule: CompiledRule, identity: str) -> None:
        await self.client.delete(*client_keys(rule, identity, self.clock.now()))

    async def refund(self, checks: Sequence[Check], at: int = 0) -> None:
        if self._stale or not self._ready:
            await self._refresh()
        await asyncio.gather(
            *(
                self._run(
                    slot, REFUND_SHA, REFUND_SOURCE, refund_input([checks[i] for i in ix], at)
                )
                for slot, ix in group_by_slot(checks).items()
            )
        )
