"""From a request to the client identity a rule counts: ``"ip:203.0.113.7"``, ``"user:42"``..."""

from __future__ import annotations

import logging
from typing import Any

from .choices import KeyKind
from .compiled import CompiledRule
from .conf import conf
from .networks import MAX_ADDRESS_CHARS, normalized

logger = logging.getLogger("django_throttle")

UNKNOWN_IP = "unknown"
MAX_FORWARDED_ENTRIES = 64  # more hops than any real proxy chain; longer headers are cut


def _normalize_ip(text: str) -> str | None:
    """The address as it is keyed (IPv6 by its network prefix), or None if it is not one."""
    if len(text) > MAX_ADDRESS_CHARS:
        return None
    return normalized(text, conf.IPV6_PREFIX)


def client_ip(request: Any) -> str:
    """The client's address: REMOTE_ADDR, or with TRUSTED_PROXIES=N the N-th X-Forwarded-For
    entry from the right. A missing or malformed value falls back to REMOTE_ADDR."""
    meta = request.META
    remote = _normalize_ip(meta.get("REMOTE_ADDR") or "")
    trusted = conf.TRUSTED_PROXIES
    if trusted > 0:
        forwarded = meta.get("HTTP_X_FORWARDED_FOR") or ""
        entries = forwarded.rsplit(",", MAX_FORWARDED_ENTRIES)[-MAX_FORWARDED_ENTRIES:]
        if len(entries) >= trusted and forwarded:
            candidate = _normalize_ip(entries[-trusted])
            if candidate is not None:
                return candidate
    return remote or UNKNOWN_IP


def _param(request: Any, name: str) -> str:
    """The value a view reads: a form post's body first (a query string added to a POST
    must not choose the counter), else the query string. Missing or empty counts as the
    value "" (one counter shared by every request without it), so leaving the parameter
    out, or sending it empty, never escapes the rule."""
    if request.method == "POST":
        try:
            body = request.POST
        except Exception:  # a body Django cannot parse (too large, malformed): not counted in it
            body = {}
        value = body.get(name)
        if value:
            return str(value)
        if name in body:
            return ""  # present and empty in the body: the query string cannot replace it
    return str(request.GET.get(name) or "")


def _user_pk(request: Any) -> str | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return str(user.pk)


# The kinds as plain strings: an enum member's lookup on its class costs more than the compare.
_IP, _USER, _GLOBAL = KeyKind.IP.value, KeyKind.USER.value, KeyKind.GLOBAL.value
_HEADER, _PARAM, _CUSTOM = KeyKind.HEADER.value, KeyKind.PARAM.value, KeyKind.CUSTOM.value
_ADDRESS_OR_USER = frozenset({_IP, _USER, KeyKind.USER_OR_IP.value})


def identity(rule: CompiledRule, request: Any, memo: dict[str, str | None]) -> str | None:
    """The identity this rule counts the request under, or None if the rule does not count it.

    ``memo`` is shared by the rules of one request so the client address and the
    user are worked out once per request.
    """
    kind = rule.key_kind
    if kind == _GLOBAL:
        return "global"
    if kind in _ADDRESS_OR_USER:
        if kind != _IP:
            if "user" not in memo:
                memo["user"] = _user_pk(request)
            pk = memo["user"]
            if pk is not None:
                return "user:" + pk
            if kind == _USER:
                return None  # anonymous requests are not counted by a user rule
        if "ip" not in memo:
            memo["ip"] = client_ip(request)
        return "ip:" + memo["ip"]  # type: ignore[operator]
    if kind == _HEADER:
        value = request.META.get(rule.header_meta_key)
        return None if value is None or value == "" else "header:" + value
    if kind == _PARAM:
        return "param:" + _param(request, rule.key_arg)
    if kind == _CUSTOM:
        assert rule.key_function is not None
        value = rule.key_function(request)
        return None if value is None else "custom:" + str(value)
    return None


# The ban check (engine/bans.py) reads a request as the rules do.
param_value = _param
user_pk = _user_pk
