"""Whether a rule counts a request at all: its audience and its exemptions."""

from __future__ import annotations

import threading
import time
from typing import Any

from .choices import AppliesTo
from .compiled import CompiledRule
from .conf import conf
from .networks import NetworkSet, network_set
from .runtime import runtime

MAX_CACHED_USERS = 10_000


class ExemptNetworks:
    """The EXEMPT_NETWORKS setting ready for lookups (a runtime part: built once per settings)."""

    def __init__(self) -> None:
        self.networks: NetworkSet = network_set(tuple(conf.EXEMPT_NETWORKS), conf.IPV6_PREFIX)


class Memberships:
    """Users' group ids as read lately, with when each is read again (a runtime part)."""

    def __init__(self) -> None:
        self.groups: dict[Any, tuple[frozenset[int], float]] = {}
        self.lock = threading.Lock()


def counts(rule: CompiledRule, request: Any, address: str) -> bool:
    """Whether ``rule`` counts this request from client ``address`` (False: the client is
    outside the rule's audience or exempt)."""
    everywhere = conf.EXEMPT_NETWORKS
    if everywhere or rule.exempt_networks:
        if everywhere and address in runtime().part(ExemptNetworks).networks:
            return False
        if address in rule.exempt_networks:
            return False
    applies = rule.audience
    if applies == AppliesTo.ALL and not rule.exempt_staff and not rule.exempt_groups:
        return True
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return applies in (AppliesTo.ALL, AppliesTo.ANONYMOUS)
    if applies == AppliesTo.ANONYMOUS or (rule.exempt_staff and user.is_staff):
        return False
    if applies == AppliesTo.GROUPS or rule.exempt_groups:
        mine = group_ids(user)
        if applies == AppliesTo.GROUPS and not mine & rule.groups:
            return False
        if mine & rule.exempt_groups:
            return False
    return True


def group_ids(user: Any) -> frozenset[int]:
    """The ids of the user's groups, read at most once per RULES_REFRESH per user."""
    now = time.monotonic()
    memberships = runtime().part(Memberships)
    cached = memberships.groups.get(user.pk)
    if cached is not None and cached[1] > now:
        return cached[0]
    ids = frozenset(user.groups.values_list("pk", flat=True))
    with memberships.lock:
        if len(memberships.groups) >= MAX_CACHED_USERS:
            memberships.groups.clear()  # a bound on memory: the next requests read again
        memberships.groups[user.pk] = (ids, now + max(conf.RULES_REFRESH, 1.0))
    return ids
