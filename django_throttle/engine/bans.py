"""Bans: a banned client's request is refused (403) before any rule, with no store call."""

from __future__ import annotations

import logging
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpResponse

from .. import metrics
from ..identities import client_ip, param_value, user_pk
from ..rejection_log import REJECT, rejection_log
from ..responses import banned_response
from ..rules import get_rules, rule_cache
from ..rules.bans import BanIndex

logger = logging.getLogger("django_throttle")

BAN = "ban"  # the name banned requests are recorded under, as a rule's would be
_NOT_READ: Any = object()  # the user, not looked up yet


def enforce_bans(request: Any) -> HttpResponse | None:
    """The 403 if the request's client is banned, else None (ThrottleMiddleware, before the
    view)."""
    bans = get_rules().bans
    if bans is None:
        return None
    return _answer(request, _banned(request, bans, _NOT_READ))


async def aenforce_bans(request: Any) -> HttpResponse | None:
    rules = rule_cache().fresh()
    if rules is None:  # a refresh may read the database, which the event loop must not
        rules = await sync_to_async(get_rules)()
    bans = rules.bans
    if bans is None:
        return None
    user = _NOT_READ
    if bans.current(time.time()).users:
        # The user, read as Django reads it on the loop (request.user would query there).
        auser = getattr(request, "auser", None)
        found = await auser() if auser is not None else None
        user = str(found.pk) if found is not None and found.is_authenticated else None
    return _answer(request, _banned(request, bans, user))


def _banned(request: Any, bans: BanIndex, user: str | None) -> str | None:
    """The identity under which the request's client is banned, or None."""
    lookup = bans.current(time.time())
    if lookup.networks:
        address = client_ip(request)
        if address in lookup.networks:
            return "ip:" + address
    keys = lookup.keys
    if lookup.users:
        pk: str | None = user_pk(request) if user is _NOT_READ else user
        if pk is not None and "user:" + pk in keys:
            return "user:" + pk
    meta = request.META
    for name in lookup.header_keys:
        value = meta.get(name)
        if value and "header:" + value in keys:
            return f"header:{value}"
    for name in lookup.params:
        key = "param:" + param_value(request, name)
        if key in keys:
            return key
    return None


def _answer(request: Any, identity: str | None) -> HttpResponse | None:
    if identity is None:
        return None
    log = rejection_log()
    try:
        log.add(BAN, identity, REJECT)
    except Exception:  # the request is refused all the same; said once, not per request
        if not log.note_failed:
            log.note_failed = True
            logger.exception("django_throttle: a banned request could not be recorded")
    metrics.banned(identity.partition(":")[0])
    return banned_response(request)
