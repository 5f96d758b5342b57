"""System checks for the DJANGO_THROTTLE settings, run by ``manage.py check``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.utils.module_loading import import_string

from .conf import BACKENDS, DEFAULTS, REDIS_CACHE_PREFIX, SETTING_NAME, TYPES, conf

MIDDLEWARE_PATH = "django_throttle.middleware.ThrottleMiddleware"
AUTH_MIDDLEWARE_PATH = "django.contrib.auth.middleware.AuthenticationMiddleware"

# Every check id, defined once.
E_NOT_A_DICT = "django_throttle.E001"
E_UNKNOWN_CACHE = "django_throttle.E002"
E_CACHE_NOT_REDIS = "django_throttle.E003"
E_BAD_BACKEND = "django_throttle.E004"
E_WRONG_TYPE = "django_throttle.E005"
E_TRUSTED_PROXIES = "django_throttle.E006"
E_MIDDLEWARE_ORDER = "django_throttle.E007"
E_IPV6_PREFIX = "django_throttle.E008"
E_RULES_REFRESH = "django_throttle.E009"  # any duration or count out of range
E_KEY_FUNCTION = "django_throttle.E010"
W_UNKNOWN_SETTING = "django_throttle.W001"


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    # bool is an int to Python, never to a reader of the settings.
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


@register(Tags.compatibility)
def check_settings(**kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, SETTING_NAME, {})
    if not isinstance(raw, dict):
        return [
            Error(
                f"{SETTING_NAME} must be a dict, not {type(raw).__name__}.",
                hint=f'Write {SETTING_NAME} = {{"FAIL_OPEN": True, ...}}.',
                id=E_NOT_A_DICT,
            )
        ]
    errors: list[CheckMessage] = []
    for name in sorted(set(raw) - set(DEFAULTS), key=repr):
        errors.append(
            Warning(
                f"{SETTING_NAME}[{name!r}] is not a setting of django_throttle and is ignored.",
                hint="Known settings: " + ", ".join(DEFAULTS) + ".",
                id=W_UNKNOWN_SETTING,
            )
        )
    bad_types = set()
    for name, types in TYPES.items():
        if name in raw and not _type_ok(raw[name], types):
            bad_types.add(name)
            if name == "TRUSTED_PROXIES":
                continue  # reported below with its own id
            errors.append(
                Error(
                    f"{SETTING_NAME}[{name!r}] must be of type "
                    f"{' or '.join(t.__name__ for t in types)}, not {type(raw[name]).__name__}.",
                    hint=f"The default is {DEFAULTS[name]!r}.",
                    id=E_WRONG_TYPE,
                )
            )
    errors.extend(_check_store(bad_types))
    errors.extend(_check_numbers(raw, bad_types))
    if "KEY_FUNCTIONS" not in bad_types:
        errors.extend(_check_key_functions(conf.KEY_FUNCTIONS))
    return errors


def _check_store(bad_types: set[str]) -> Iterable[CheckMessage]:
    if "BACKEND" not in bad_types and conf.BACKEND not in BACKENDS:
        yield Error(
            f"{SETTING_NAME}['BACKEND'] is {conf.BACKEND!r}.",
            hint="Use 'auto', 'redis' or 'memory'.",
            id=E_BAD_BACKEND,
        )
    if "CACHE" in bad_types:
        return
    path = conf.cache_backend_path
    if path is None:
        yield Error(
            f"{SETTING_NAME}['CACHE'] names the cache {conf.CACHE!r}, which is not in CACHES.",
            hint="Set it to the alias of your django-redis cache, e.g. 'default'.",
            id=E_UNKNOWN_CACHE,
        )
    elif conf.BACKEND == "redis" and not path.startswith(REDIS_CACHE_PREFIX):
        yield Error(
            f"{SETTING_NAME}['BACKEND'] is 'redis' but the cache {conf.CACHE!r} uses {path}.",
            hint="Point CACHE at a cache whose BACKEND is django_redis.cache.RedisCache.",
            id=E_CACHE_NOT_REDIS,
        )


# Numeric settings with their lower bound, and whether the bound itself is excluded.
_DURATIONS = (
    ("RULES_REFRESH", 0, False),
    ("TIMEOUT", 0, True),
    ("CONNECT_TIMEOUT", 0, True),
    ("BREAKER_INTERVAL", 0, False),
    ("FLUSH_INTERVAL", 0, True),
    ("RETENTION_DAYS", 1, False),
)


def _check_numbers(raw: dict[str, Any], bad_types: set[str]) -> Iterable[CheckMessage]:
    proxies = raw.get("TRUSTED_PROXIES", 0)
    if "TRUSTED_PROXIES" in bad_types or proxies < 0:
        yield Error(
            f"{SETTING_NAME}['TRUSTED_PROXIES'] must be a whole number of at least 0, "
            f"not {proxies!r}.",
            hint="The number of proxies in front of Django that append to X-Forwarded-For; "
            "0 uses REMOTE_ADDR only.",
            id=E_TRUSTED_PROXIES,
        )
    if "IPV6_PREFIX" not in bad_types and not 0 <= conf.IPV6_PREFIX <= 128:
        yield Error(
            f"{SETTING_NAME}['IPV6_PREFIX'] must be between 0 and 128, not {conf.IPV6_PREFIX}.",
            hint="64 keys an IPv6 client by its /64 network, the usual size of one customer's.",
            id=E_IPV6_PREFIX,
        )
    for name, minimum, strict in _DURATIONS:
        value = getattr(conf, name)
        if name not in bad_types and (value <= minimum if strict else value < minimum):
            relation = "more than" if strict else "at least"
            yield Error(
                f"{SETTING_NAME}[{name!r}] must be {relation} {minimum}, not {value!r}.",
                hint=f"The default is {DEFAULTS[name]!r}.",
                id=E_RULES_REFRESH,
            )


def _check_key_functions(functions: dict[str, Any]) -> Iterable[CheckMessage]:
    for name, path in functions.items():
        try:
            function = import_string(path) if isinstance(path, str) else None
        except ImportError as exc:
            function, reason = None, str(exc)
        else:
            reason = "it is not callable" if function is not None else "it is not a dotted path"
        if not callable(function):
            yield Error(
                f"{SETTING_NAME}['KEY_FUNCTIONS'][{name!r}] = {path!r} cannot be used: {reason}.",
                hint="Give the dotted path of a function that takes the request and returns a "
                "string or None.",
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
                f"{MIDDLEWARE_PATH} is listed before {AUTH_MIDDLEWARE_PATH}.",
                hint="Move it after AuthenticationMiddleware so rules keyed by user see the user.",
                id=E_MIDDLEWARE_ORDER,
            )
        ]
    return []
