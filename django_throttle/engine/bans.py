"""Bans: a banned client's request is refused (403) before any rule, with no store call."""

from __future__ import annotations

import logging
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpResponse

from .. import metrics
from ..rejection_log import REJECT, rejection_log
from ..responses import banned_response
from ..rules.bans import BanIndex
from .pipeline import param_value, user_pk
from .request_state import ATTR, UNREAD_USER, Client, Parts, RequestState

logger = logging.getLogger("django_throttle")

BAN = "ban"  # the name banned requests are recorded under, as a rule's would be


def enforce_bans(request: Any) -> HttpResponse | None:
    """The 403 if the request's client is banned, else None (ThrottleMiddleware, after
    begin(), before the view): the client as begin() identified it, the bans loaded with the
    rules."""
    parts, client = _began(request)
    bans = parts.rules.get().bans
    if bans is None:
        return None
    identity = _banned(client, bans, UNREAD_USER)
    return None if identity is None else _answer(request, identity)


async def aenforce_bans(request: Any) -> HttpResponse | None:
    parts, client = _began(request)
    cache = parts.rules
    rules = cache.fresh()
    if rules is None:  # a refresh may read the database, which the event loop must not
        rules = await sync_to_async(cache.get)()
    bans = rules.bans
    if bans is None:
        return None
    user = UNREAD_USER
    if bans.current(time.time()).users:
        # The user, read as Django reads it on the loop (request.user would query there).
        auser = getattr(request, "auser", None)
        found = await auser() if auser is not None else None
        user = str(found.pk) if found is not None and found.is_authenticated else None
    identity = _banned(client, bans, user)
    return None if identity is None else _answer(request, identity)


def _began(request: Any) -> tuple[Parts, Client]:
    """What begin() left on the request: the runtime's parts and the client."""
    state: RequestState = getattr(request, ATTR)
    assert state.parts is not None and state.client is not None  # begin() made them
    return state.parts, state.client


def _banned(client: Client, bans: BanIndex, user: str | None) -> str | None:
    """The identity under which the request's client is banned, or None."""
    request = client.request
    lookup = bans.current(time.time())
    if lookup.networks:
        address = client.ip
        if address is not None and address in lookup.networks:
            return "ip:" + address
    keys = lookup.keys
    if lookup.users:
        pk: str | None = user_pk(request) if user is UNREAD_USER else user
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


def _answer(request: Any, identity: str) -> HttpResponse:
    log = rejection_log()
    try:
        log.add(BAN, identity, REJECT)
    except Exception:  # the request is refused all the same; said once, not per request
        if not log.note_failed:
            log.note_failed = True
            logger.exception("django_throttle: a banned request could not be recorded")
    metrics.banned(identity.partition(":")[0])
    return banned_response(request)
