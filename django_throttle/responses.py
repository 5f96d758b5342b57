"""Rate-limit headers, and the 429 / 503 responses (and a banned client's 403)."""

from __future__ import annotations

import functools
import math
import time
from typing import Any, NamedTuple

from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.http.response import ResponseHeaders
from django.template.loader import render_to_string
from django.utils.module_loading import import_string
from django.utils.translation import get_language, ngettext
from django.utils.translation import gettext as _

from .conf import conf
from .decision import Decision

RETRY_AFTER = "Retry-After"
X_LIMIT = "X-RateLimit-Limit"
X_REMAINING = "X-RateLimit-Remaining"
X_RESET = "X-RateLimit-Reset"
POLICY = "RateLimit-Policy"
RATELIMIT = "RateLimit"
TEMPLATE = "django_throttle/429.html"
BANNED_TEMPLATE = "django_throttle/403.html"

HTML, JSON, PROBLEM = "text/html", "application/json", "application/problem+json"
# RFC 9457 problem types: draft-ietf-httpapi-ratelimit-headers' for a 429; for a 503, "about:blank"
# (the status says it all).
QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
ABOUT_BLANK = "about:blank"
# What content negotiation reads of Accept: a 429 costs the same whatever the client sends
# (Django parses every range of the header, so 180,000 of them took 2 s of CPU).
MAX_ACCEPT_CHARS = 4096
MAX_MEDIA_RANGES = 32


def retry_after_seconds(decision: Decision) -> int:
    return max(1, math.ceil(decision.retry_after))


@functools.lru_cache(maxsize=1024)  # rule names: a small, fixed set
def _sf_string(text: str) -> str:
    """A structured-field string (RFC 8941): printable ASCII, with quotes and backslashes escaped."""
    text = "".join(c if " " <= c <= "~" else "?" for c in text)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def policy_field(name: str, limit: int, period: int | None) -> str:
    """A rule's RateLimit-Policy item: its name, quota and window (seconds)."""
    return _policy(_sf_string(name), limit, period)


def _policy(quoted_name: str, limit: int, period: int | None) -> str:
    return f"{quoted_name};q={limit};w={period}"


def add_headers(response: HttpResponseBase, decision: Decision) -> None:
    """X-RateLimit-* and the IETF RateLimit-Policy / RateLimit fields of the deciding rule."""
    _write(response, decision, _header_store(response))


def add_missing_headers(response: HttpResponseBase, decision: Decision) -> None:
    """add_headers() on a response without X-RateLimit-Limit (our own 429s have theirs), and
    Retry-After on a 429 or 503 without one: what the response of a decided request gets on
    its way out, with Django's header dict fetched once."""
    store = _header_store(response)
    if response.has_header(X_LIMIT) if store is None else _LOWER[X_LIMIT] in store:
        return
    _write(response, decision, store)
    if response.status_code in (429, 503) and not (
        response.has_header(RETRY_AFTER) if store is None else _LOWER[RETRY_AFTER] in store
    ):
        response[RETRY_AFTER] = str(retry_after_seconds(decision))


def _write(
    response: HttpResponseBase, decision: Decision, store: dict[str, tuple[str, str]] | None
) -> None:
    rule, limit = decision.rule, decision.limit
    if rule is None or limit is None:
        return
    remaining = max(0, decision.remaining or 0)
    now = decision.decided_at or time.time()  # the store's clock, when it was asked
    reset_at = math.ceil(decision.reset_at or now)
    name = _sf_string(rule)  # quoted once for both fields that name the rule
    fields = (
        (X_LIMIT, str(limit)),
        (X_REMAINING, str(remaining)),
        (X_RESET, str(reset_at)),
        (POLICY, _policy(name, limit, decision.period)),
        (RATELIMIT, f"{name};r={remaining};t={max(0, reset_at - math.floor(now))}"),
    )
    if store is None:
        for field, value in fields:
            response[field] = value
        return
    # Every value is digits or printable ASCII (_sf_string), which Django's checks (latin-1,
    # no line break) could only confirm: set by name, the five cost about 14 µs more a request
    # under ASGI, where the caches are cold, and 6 under WSGI (docs/benchmarks.md).
    for field, value in fields:
        store[_LOWER[field]] = (field, value)


_LOWER = {
    field: field.lower()
    for field in (RETRY_AFTER, X_LIMIT, X_REMAINING, X_RESET, POLICY, RATELIMIT)
}


def _header_store(response: HttpResponseBase) -> dict[str, tuple[str, str]] | None:
    """The dict behind Django's ResponseHeaders (lowercased name: (name, value)), or None
    where the fields must be set by name: headers of another kind, a response class with its
    own ``__setitem__`` or ``has_header``, or a Django that keeps its headers otherwise."""
    cls, headers = type(response), response.headers
    if (
        type(headers) is not ResponseHeaders
        or cls.__setitem__ is not _SET_FIELD
        or cls.has_header is not _HAS_FIELD
    ):
        return None
    store = getattr(headers, "_store", None)
    return store if type(store) is dict else None


_SET_FIELD, _HAS_FIELD = HttpResponseBase.__setitem__, HttpResponseBase.has_header


def wants_json(request: HttpRequest) -> bool:
    """Whether the client prefers application/json to text/html (Accept negotiation)."""
    return body_type(request) == JSON


def body_type(request: HttpRequest) -> str:
    """HTML, JSON or PROBLEM: what the client's Accept prefers for a rejection's body.

    application/problem+json is chosen only where the client names it (a wildcard such as
    ``*/*`` or ``application/*`` keeps HTML or JSON, as before it was offered), and wins a tie
    in quality: a client that names it understands it."""
    accept = request.META.get("HTTP_ACCEPT")
    if accept is None:
        return HTML
    accept = str(accept)
    if len(accept) > MAX_ACCEPT_CHARS:
        cut = accept[:MAX_ACCEPT_CHARS]
        accept = cut[: max(0, cut.rfind(","))]  # a range cut short is not read at all
    return _negotiated(accept)


@functools.lru_cache(maxsize=256)  # clients send few distinct headers: a flood's is read once
def _negotiated(accept: str) -> str:
    ranges = [r for r in accept.split(",") if r.strip()][:MAX_MEDIA_RANGES]
    accepted = [r for r in map(media_range, ranges) if r.quality > 0]
    by_quality = sorted(accepted, key=lambda r: (r.quality, r.specificity), reverse=True)
    by_precedence = sorted(by_quality, key=lambda r: (r.specificity, r.quality), reverse=True)
    html, json = _match(HTML, by_precedence), _match(JSON, by_precedence)
    # As Django's get_preferred_type(): the offer whose range comes first by quality, HTML on
    # a tie (both matched by one range).
    preferred = None
    if html is not None:
        preferred = HTML
    if json is not None and (html is None or by_quality.index(json) < by_quality.index(html)):
        preferred = JSON
    problem = _match(PROBLEM, by_precedence)
    if problem is not None and problem.specificity >= 2:  # application/problem+json itself
        other = html if preferred == HTML else json if preferred == JSON else None
        if other is None or problem.quality >= other.quality:
            return PROBLEM
    return JSON if preferred == JSON else HTML


class MediaRange(NamedTuple):
    """One range of Accept, as Django's MediaType reads it (its parameters but q only told
    apart: a range with any never matches the plain types a rejection offers)."""

    main: str
    sub: str
    quality: float
    params: bool

    @property
    def specificity(self) -> int:
        if self.main == "*":
            return 0
        if self.sub == "*":
            return 1
        return 3 if self.params else 2


def media_range(text: str) -> MediaRange:
    """A media range, parsed without Django's email-based parser (60 µs a range with q)."""
    full, *pieces = text.split(";")
    main, _, sub = full.strip().lower().partition("/")
    quality, params = 1.0, False
    for piece in pieces:
        name, eq, value = piece.partition("=")
        name = name.strip().lower()
        if name != "q":
            params = params or bool(name)
            continue
        try:
            q = float(value.strip().strip('"')) if eq else 1.0
        except ValueError:
            q = 1.0  # as Django: an invalid quality is 1
        quality = round(q, 3) if 0 <= q <= 1 else 1.0
    return MediaRange(main, sub, quality, params)


def _match(offered: str, by_precedence: list[MediaRange]) -> MediaRange | None:
    """The range of Accept that ``offered`` (a type without parameters) falls under, as
    Django's accepted_type() finds it."""
    main, _, sub = offered.partition("/")
    for accepted in by_precedence:
        if (
            accepted.main
            and accepted.sub
            and not accepted.params
            and accepted.main in (main, "*")
            and accepted.sub in (sub, "*")
        ):
            return accepted
    return None


def rejected(request: HttpRequest, decision: Decision) -> HttpResponse:
    """The 429 (or, for a fail-closed rule with the store down, 503) response."""
    view_path = conf.REJECTION_VIEW
    response: HttpResponse
    if view_path:
        response = import_string(view_path)(request, decision)
    else:
        response = default_rejection(request, decision)
    rejection_headers(response, decision)
    # Rejections are expected and recorded on the dashboard; without this, Django's request
    # logger would write each 429 as a warning and each 503 as an error (mailed to ADMINS).
    response._has_been_logged = True  # type: ignore[attr-defined]  # Django's own flag, not in django-stubs
    return response


def default_rejection(request: HttpRequest, decision: Decision) -> HttpResponse:
    status = 503 if decision.unavailable else 429
    seconds = retry_after_seconds(decision)
    detail = rejection_detail(decision)
    kind = body_type(request)
    if kind == PROBLEM:
        return problem_response(decision, detail, seconds)
    if kind == JSON:
        return JsonResponse({"detail": detail, "retry_after": seconds}, status=status)
    context: dict[str, Any] = {
        "retry_after": seconds,
        "unavailable": decision.unavailable,
        "rule": decision.rule,
        "language": page_language(decision.unavailable),
    }
    return HttpResponse(render_to_string(TEMPLATE, context, request=request), status=status)


def page_language(unavailable: bool) -> str:
    """The language the page is written in, for its ``lang``: the active one if a catalogue
    translates the page's heading into it, else English, the text of the template itself.
    (LANGUAGE_CODE exists only with the i18n context processor, which startproject leaves
    out.)"""
    return _language("Service unavailable" if unavailable else "Too many requests")


def _language(heading: str) -> str:
    language = get_language() or "en"
    if language.startswith("en") or _(heading) != heading:
        return language
    return "en"


def rejection_detail(decision: Decision) -> str:
    """What a rejection tells the client, in the active language."""
    if decision.unavailable:
        return _("The service is temporarily unavailable. Please try again later.")
    seconds = retry_after_seconds(decision)
    return ngettext(
        "Too many requests. Please try again in %(seconds)d second.",
        "Too many requests. Please try again in %(seconds)d seconds.",
        seconds,
    ) % {"seconds": seconds}


def rejection_headers(response: HttpResponseBase, decision: Decision) -> None:
    """Retry-After, and the rate-limit fields but for a store outage's 503."""
    response[RETRY_AFTER] = str(retry_after_seconds(decision))
    if not decision.unavailable:
        add_headers(response, decision)


def problem_response(decision: Decision, detail: str, seconds: int) -> JsonResponse:
    """The rejection as an RFC 9457 problem (application/problem+json)."""
    problem: dict[str, Any]
    if decision.unavailable:
        problem = {
            "type": ABOUT_BLANK,
            "title": _("Service Unavailable"),
            "status": 503,
            "detail": detail,
            "retry_after": seconds,
        }
    else:
        problem = {
            "type": QUOTA_EXCEEDED,
            "title": _("Request cannot be satisfied as assigned quota has been exceeded"),
            "status": 429,
            "detail": detail,
            "violated-policies": violated_policies(decision),
            "retry_after": seconds,
        }
    return JsonResponse(problem, status=problem["status"], content_type=PROBLEM)


def violated_policies(decision: Decision) -> list[str]:
    """The names of the enforcing rules that rejected, each once, in the order decided (the
    policy names of the RateLimit-Policy field)."""
    names = [r.rule.name for r in decision.results if not r.allowed and r.rule.enforcing]
    if not names and decision.rule is not None:
        names = [decision.rule]
    return list(dict.fromkeys(names))


def banned_response(request: HttpRequest) -> HttpResponse:
    """The 403 of a banned client, in the body its Accept prefers, as a 429's."""
    detail = _("Requests from this client are not allowed.")
    kind = body_type(request)
    response: HttpResponse
    if kind == PROBLEM:
        problem = {"type": ABOUT_BLANK, "title": _("Forbidden"), "status": 403, "detail": detail}
        response = JsonResponse(problem, status=403, content_type=PROBLEM)
    elif kind == JSON:
        response = JsonResponse({"detail": detail}, status=403)
    else:
        context = {"language": _language("Forbidden")}
        response = HttpResponse(
            render_to_string(BANNED_TEMPLATE, context, request=request), status=403
        )
    # Recorded on the dashboard under "ban", not logged by Django's request logger.
    response._has_been_logged = True  # type: ignore[attr-defined]  # Django's own flag
    return response
