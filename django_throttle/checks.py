"""System checks for the DJANGO_THROTTLE settings, run by ``manage.py check``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.utils.module_loading import import_string
from django.utils.translation import gettext as _

from . import metrics
from .calendar_windows import time_zone
from .conf import (
    E_BAD_CHOICE,
    E_EXEMPT_NETWORKS,
    E_TIME_ZONE,
    REDIS_CACHE_PREFIX,
    SETTING_NAME,
    Settings,
    conf,
)
from .networks import parse_networks

MIDDLEWARE_PATH = "django_throttle.middleware.ThrottleMiddleware"
AUTH_MIDDLEWARE_PATH = "django.contrib.auth.middleware.AuthenticationMiddleware"

# Every check id, defined once (those of a setting's own validation are in conf.py).
E_NOT_A_DICT = "django_throttle.E001"
E_UNKNOWN_CACHE = "django_throttle.E002"
E_CACHE_NOT_REDIS = "django_throttle.E003"
E_MIDDLEWARE_ORDER = "django_throttle.E007"
E_KEY_FUNCTION = "django_throttle.E010"
E_CLUSTER_URL = "django_throttle.E011"
E_KEY_PREFIX = "django_throttle.E012"
E_METRICS_CLIENT = "django_throttle.E015"
W_UNKNOWN_SETTING = "django_throttle.W001"
W_MEMORY_BACKEND = "django_throttle.W002"


@register(Tags.compatibility)
def check_settings(**kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, SETTING_NAME, {})
    if not isinstance(raw, dict):
        return [
            Error(
                _("%(setting)s must be a dict, not %(type)s.")
                % {"setting": SETTING_NAME, "type": type(raw).__name__},
                hint=_("Write %(example)s.")
                % {"example": f'{SETTING_NAME} = {{"FAIL_OPEN": True, ...}}'},
                id=E_NOT_A_DICT,
            )
        ]
    declared = Settings.declared()
    errors: list[CheckMessage] = []
    for name in sorted(set(raw) - set(declared), key=repr):
        errors.append(
            Warning(
                _("%(setting)s is not a setting of django_throttle and is ignored.")
                % {"setting": f"{SETTING_NAME}[{name!r}]"},
                hint=_("Known settings: %(names)s.") % {"names": ", ".join(declared)},
                id=W_UNKNOWN_SETTING,
            )
        )
    bad = set()
    for name, setting in declared.items():
        problem = setting.problem(raw[name]) if name in raw else None
        if problem is not None:
            bad.add(name)
            errors.append(Error(problem.message, hint=problem.hint, id=problem.id))
    if not bad & {"CACHE", "BACKEND"}:
        errors.extend(_check_store())
    if "KEY_FUNCTIONS" not in bad:
        errors.extend(_check_key_functions(conf.KEY_FUNCTIONS))
    # Settings a parser validates: (name, parser, hint, check id).
    parsed: list[tuple[str, Callable[[Any], object], str, str]] = [
        (
            "EXEMPT_NETWORKS",
            parse_networks,
            _("Give CIDRs, e.g. %(example)s.") % {"example": '["10.0.0.0/8", "2001:db8::/32"]'},
            E_EXEMPT_NETWORKS,
        ),
        ("TIME_ZONE", time_zone, Settings.TIME_ZONE.hint, E_TIME_ZONE),
    ]
    for name, parse, hint, error_id in parsed:
        if name in bad:
            continue
        try:
            parse(getattr(conf, name))
        except ValueError as exc:
            errors.append(Error(f"{SETTING_NAME}[{name!r}]: {exc}.", hint=hint, id=error_id))
    if "CLUSTER_URL" not in bad and conf.CLUSTER_URL is not None:
        errors.extend(_check_cluster_url(conf.CLUSTER_URL))
    if "KEY_PREFIX" not in bad and ("{" in conf.KEY_PREFIX or "}" in conf.KEY_PREFIX):
        errors.append(
            Error(
                _("%(setting)s = %(value)r contains a brace.")
                % {"setting": f"{SETTING_NAME}['KEY_PREFIX']", "value": conf.KEY_PREFIX},
                hint=_(
                    "Braces in a Redis key make a Redis Cluster hash tag; the client's part of "
                    "each key is the tag, so the prefix must not have one. Use e.g. 'thr'."
                ),
                id=E_KEY_PREFIX,
            )
        )
    if "METRICS" not in bad:
        errors.extend(_check_metrics(conf.METRICS))
    return errors


def _check_metrics(value: bool | str) -> Iterable[CheckMessage]:
    if isinstance(value, str) and value != "auto":
        yield Error(
            _("%(setting)s is %(value)r.")
            % {"setting": f"{SETTING_NAME}['METRICS']", "value": value},
            hint=_("Use True, False or 'auto' (on when prometheus_client is installed)."),
            id=E_BAD_CHOICE,
        )
    elif value is True and not metrics.client_installed():
        yield Error(
            _("%(setting)s is True but prometheus_client is not installed.")
            % {"setting": f"{SETTING_NAME}['METRICS']"},
            hint=_(
                "Install it with the extra: %(command)s, or set METRICS to "
                "'auto' to record metrics only where it is installed."
            )
            % {"command": metrics.INSTALL_HINT},
            id=E_METRICS_CLIENT,
        )


def _check_cluster_url(url: str) -> Iterable[CheckMessage]:
    parsed = urlparse(url)
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if parsed.scheme not in ("redis", "rediss") or not parsed.hostname or port == -1:
        yield Error(
            _("%(setting)s = %(value)r is not the URL of a Redis node.")
            % {"setting": f"{SETTING_NAME}['CLUSTER_URL']", "value": url},
            hint=_('Give any node of the cluster: "redis://host:7000", or "rediss://..." for TLS.'),
            id=E_CLUSTER_URL,
        )


def _check_store() -> Iterable[CheckMessage]:
    path = conf.cache_backend_path
    if path is None:
        yield Error(
            _("%(setting)s names the cache %(cache)r, which is not in CACHES.")
            % {"setting": f"{SETTING_NAME}['CACHE']", "cache": conf.CACHE},
            hint=_("Set it to the alias of your django-redis cache, e.g. 'default'."),
            id=E_UNKNOWN_CACHE,
        )
    elif conf.BACKEND == "redis" and not path.startswith(REDIS_CACHE_PREFIX):
        yield Error(
            _("%(setting)s is 'redis' but the cache %(cache)r uses %(path)s.")
            % {"setting": f"{SETTING_NAME}['BACKEND']", "cache": conf.CACHE, "path": path},
            hint=_("Point CACHE at a cache whose BACKEND is django_redis.cache.RedisCache."),
            id=E_CACHE_NOT_REDIS,
        )
    elif not conf.uses_redis and not settings.DEBUG and conf.BACKEND == "auto":
        yield Warning(
            _(
                "Rate limits are counted in each process's memory: the cache %(cache)r "
                "uses %(path)s, not django-redis, so every process (and every "
                "server) enforces its own limits."
            )
            % {"cache": conf.CACHE, "path": path or _("no backend")},
            hint=_(
                "Configure a django-redis cache and point DJANGO_THROTTLE['CACHE'] at it, or "
                "set DJANGO_THROTTLE['BACKEND'] = 'memory' to say per-process limits are meant."
            ),
            id=W_MEMORY_BACKEND,
        )


def _check_key_functions(functions: dict[str, Any]) -> Iterable[CheckMessage]:
    for name, path in functions.items():
        try:
            function = import_string(path) if isinstance(path, str) else None
        except ImportError as exc:
            function, reason = None, str(exc)
        else:
            reason = (
                _("it is not callable") if function is not None else _("it is not a dotted path")
            )
        if not callable(function):
            yield Error(
                _("%(setting)s = %(value)r cannot be used: %(reason)s.")
                % {
                    "setting": f"{SETTING_NAME}['KEY_FUNCTIONS'][{name!r}]",
                    "value": path,
                    "reason": reason,
                },
                hint=_(
                    "Give the dotted path of a function that takes the request and returns a "
                    "string or None."
                ),
                id=E_KEY_FUNCTION,
            )


@register(Tags.compatibility)
def check_middleware(**kwargs: Any) -> list[CheckMessage]:
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    if MIDDLEWARE_PATH not in middleware or AUTH_MIDDLEWARE_PATH not in middleware:
        return []
    if middleware.index(MIDDLEWARE_PATH) < middleware.index(AUTH_MIDDLEWARE_PATH):
        return [
            Error(
                _("%(middleware)s is listed before %(auth)s.")
                % {"middleware": MIDDLEWARE_PATH, "auth": AUTH_MIDDLEWARE_PATH},
                hint=_(
                    "Move it after AuthenticationMiddleware so rules keyed by user see the user."
                ),
                id=E_MIDDLEWARE_ORDER,
            )
        ]
    return []
