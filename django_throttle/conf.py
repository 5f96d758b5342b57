"""Settings of django_throttle, read from ``settings.DJANGO_THROTTLE`` at access time."""

from __future__ import annotations

from typing import Any

from django.conf import settings

SETTING_NAME = "DJANGO_THROTTLE"

# Every key of DJANGO_THROTTLE with its default and the types it accepts. The
# system checks validate against this table, so it is the only place a new
# setting needs to be declared.
DEFAULTS: dict[str, Any] = {
    "CACHE": "default",
    "BACKEND": "auto",
    "FAIL_OPEN": True,
    "TRUSTED_PROXIES": 0,
    "IPV6_PREFIX": 64,
    "RULES_REFRESH": 1.0,
    "HEADERS": True,
    "KEY_FUNCTIONS": {},
    "KEY_PREFIX": "thr",
    "REJECTION_VIEW": None,
    "TIMEOUT": 0.1,
    "CONNECT_TIMEOUT": 0.1,
    "BREAKER_INTERVAL": 2.0,
    "LOCAL_FALLBACK": True,
    "FLUSH_INTERVAL": 10.0,
    "RETENTION_DAYS": 30,
}

TYPES: dict[str, tuple[type, ...]] = {
    "CACHE": (str,),
    "BACKEND": (str,),
    "FAIL_OPEN": (bool,),
    "TRUSTED_PROXIES": (int,),
    "IPV6_PREFIX": (int,),
    "RULES_REFRESH": (int, float),
    "HEADERS": (bool,),
    "KEY_FUNCTIONS": (dict,),
    "KEY_PREFIX": (str,),
    "REJECTION_VIEW": (str, type(None)),
    "TIMEOUT": (int, float),
    "CONNECT_TIMEOUT": (int, float),
    "BREAKER_INTERVAL": (int, float),
    "LOCAL_FALLBACK": (bool,),
    "FLUSH_INTERVAL": (int, float),
    "RETENTION_DAYS": (int,),
}

BACKENDS = ("auto", "redis", "memory")
REDIS_CACHE_PREFIX = "django_redis."


class Settings:
    """One typed property per setting; nothing is cached, so override_settings works."""

    @property
    def raw(self) -> dict[str, Any]:
        value = getattr(settings, SETTING_NAME, {})
        return value if isinstance(value, dict) else {}

    def _get(self, name: str) -> Any:
        return self.raw.get(name, DEFAULTS[name])

    @property
    def CACHE(self) -> str:
        return self._get("CACHE")

    @property
    def BACKEND(self) -> str:
        return self._get("BACKEND")

    @property
    def FAIL_OPEN(self) -> bool:
        return self._get("FAIL_OPEN")

    @property
    def TRUSTED_PROXIES(self) -> int:
        return self._get("TRUSTED_PROXIES")

    @property
    def IPV6_PREFIX(self) -> int:
        return self._get("IPV6_PREFIX")

    @property
    def RULES_REFRESH(self) -> float:
        return float(self._get("RULES_REFRESH"))

    @property
    def HEADERS(self) -> bool:
        return self._get("HEADERS")

    @property
    def KEY_FUNCTIONS(self) -> dict[str, str]:
        return self._get("KEY_FUNCTIONS")

    @property
    def KEY_PREFIX(self) -> str:
        return self._get("KEY_PREFIX")

    @property
    def REJECTION_VIEW(self) -> str | None:
        return self._get("REJECTION_VIEW")

    @property
    def TIMEOUT(self) -> float:
        return float(self._get("TIMEOUT"))

    @property
    def CONNECT_TIMEOUT(self) -> float:
        return float(self._get("CONNECT_TIMEOUT"))

    @property
    def BREAKER_INTERVAL(self) -> float:
        return float(self._get("BREAKER_INTERVAL"))

    @property
    def LOCAL_FALLBACK(self) -> bool:
        return self._get("LOCAL_FALLBACK")

    @property
    def FLUSH_INTERVAL(self) -> float:
        return float(self._get("FLUSH_INTERVAL"))

    @property
    def RETENTION_DAYS(self) -> int:
        return self._get("RETENTION_DAYS")

    @property
    def cache_backend_path(self) -> str | None:
        """Dotted path of the BACKEND of the configured cache, None if the alias is unknown."""
        cache = getattr(settings, "CACHES", {}).get(self.CACHE)
        return None if cache is None else cache.get("BACKEND", "")

    @property
    def uses_redis(self) -> bool:
        """Whether decisions go to Redis (else the in-process memory backend)."""
        backend = self.BACKEND
        if backend == "auto":
            path = self.cache_backend_path or ""
            return path.startswith(REDIS_CACHE_PREFIX)
        return backend == "redis"


conf = Settings()
