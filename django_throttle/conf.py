"""Settings of django_throttle, read from ``settings.DJANGO_THROTTLE``, each declared once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from django.conf import settings

from .runtime import current

SETTING_NAME = "DJANGO_THROTTLE"
REDIS_CACHE_PREFIX = "django_redis."

T = TypeVar("T")

# Check ids of the settings' own validation (the others are in checks.py).
E_BAD_CHOICE = "django_throttle.E004"
E_WRONG_TYPE = "django_throttle.E005"
E_TRUSTED_PROXIES = "django_throttle.E006"
E_IPV6_PREFIX = "django_throttle.E008"
E_OUT_OF_RANGE = "django_throttle.E009"
E_EXEMPT_NETWORKS = "django_throttle.E013"
E_TIME_ZONE = "django_throttle.E014"


@dataclass(frozen=True)
class Problem:
    """What is wrong with a setting's value, for a system check."""

    id: str
    message: str
    hint: str


def raw_settings() -> dict[str, Any]:
    value = getattr(settings, SETTING_NAME, {})
    return value if isinstance(value, dict) else {}


class Setting(Generic[T]):
    """One key of DJANGO_THROTTLE: its type, default and valid range, declared once."""

    name: str

    def __init__(
        self,
        default: T,
        types: tuple[type[Any], ...],
        *,
        convert: Callable[[Any], T] | None = None,
        minimum: float | None = None,
        above: bool = False,  # the minimum itself is not allowed
        maximum: float | None = None,
        choices: tuple[str, ...] = (),
        error_id: str = E_OUT_OF_RANGE,
        type_error_id: str = E_WRONG_TYPE,
        hint: str = "",
    ) -> None:
        self.default = default
        self.types = types
        self.convert = convert
        self.minimum, self.above, self.maximum = minimum, above, maximum
        self.choices = choices
        self.error_id, self.type_error_id = error_id, type_error_id
        self.hint = hint or f"The default is {default!r}."

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Setting[T]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> T: ...
    def __get__(self, obj: object | None, owner: type) -> Setting[T] | T:
        if obj is None:
            return self
        # The runtime's dict: a value read while the settings change lands in the runtime
        # being replaced, never in the new one.
        values = current.runtime.settings
        try:
            return values[self.name]  # type: ignore[no-any-return]
        except KeyError:
            pass
        value: T = raw_settings().get(self.name, self.default)
        if self.convert is not None:
            value = self.convert(value)
        values[self.name] = value
        return value

    def problem(self, value: Any) -> Problem | None:
        """Why ``value`` cannot be this setting, or None."""
        # bool is an int to Python, never to a reader of the settings.
        if not isinstance(value, self.types) or (
            isinstance(value, bool) and bool not in self.types
        ):
            return Problem(
                self.type_error_id,
                f"{SETTING_NAME}[{self.name!r}] must be of type "
                f"{' or '.join(t.__name__ for t in self.types)}, not {value!r} "
                f"({type(value).__name__}).",
                self.hint,
            )
        if self.choices and isinstance(value, str) and value not in self.choices:
            return Problem(
                self.error_id,
                f"{SETTING_NAME}[{self.name!r}] is {value!r}.",
                "Use " + ", ".join(repr(c) for c in self.choices) + ".",
            )
        if not isinstance(value, _NUMBER):
            return None  # the range is a number's: a word (MAX_DELAYED's "auto") or None
        low, high = self.minimum, self.maximum
        if (
            (low is not None and (value <= low if self.above else value < low))
            or high is not None
            and value > high
        ):
            if high is not None and self.above:
                wanted = f"more than {low:g} and at most {high:g}"
            elif high is not None:
                wanted = f"between {low:g} and {high:g}"
            else:
                wanted = f"{'more than' if self.above else 'at least'} {low:g}"
            return Problem(
                self.error_id,
                f"{SETTING_NAME}[{self.name!r}] must be {wanted}, not {value!r}.",
                self.hint,
            )
        return None


_NUMBER = (int, float)


class Settings:
    """Every setting of django_throttle, each declared once."""

    CACHE = Setting[str](
        "default",
        (str,),
        hint="Set it to the alias of your django-redis cache, e.g. 'default'.",
    )
    BACKEND = Setting[str](
        "auto", (str,), choices=("auto", "redis", "memory"), error_id=E_BAD_CHOICE
    )
    FAIL_OPEN = Setting[bool](True, (bool,))
    TRUSTED_PROXIES = Setting[int](
        0,
        (int,),
        minimum=0,
        error_id=E_TRUSTED_PROXIES,
        type_error_id=E_TRUSTED_PROXIES,
        hint="The number of proxies in front of Django that append to X-Forwarded-For; "
        "0 uses REMOTE_ADDR only.",
    )
    IPV6_PREFIX = Setting[int](
        64,
        (int,),
        minimum=0,
        maximum=128,
        error_id=E_IPV6_PREFIX,
        hint="64 keys an IPv6 client by its /64 network, the usual size of one customer's.",
    )
    RULES_REFRESH = Setting[float](1.0, _NUMBER, convert=float, minimum=0)
    HEADERS = Setting[bool](True, (bool,))
    KEY_FUNCTIONS = Setting[dict[str, str]]({}, (dict,))
    KEY_PREFIX = Setting[str]("thr", (str,))
    REJECTION_VIEW = Setting["str | None"](None, (str, type(None)))
    TIMEOUT = Setting[float](0.1, _NUMBER, convert=float, minimum=0, above=True)
    CONNECT_TIMEOUT = Setting[float](0.1, _NUMBER, convert=float, minimum=0, above=True)
    BREAKER_INTERVAL = Setting[float](2.0, _NUMBER, convert=float, minimum=0)
    LOCAL_FALLBACK = Setting[bool](True, (bool,))
    FLUSH_INTERVAL = Setting[float](10.0, _NUMBER, convert=float, minimum=0, above=True)
    RETENTION_DAYS = Setting[int](30, (int,), minimum=1)
    EXEMPT_NETWORKS = Setting[list[str]](
        [],
        (list, tuple),
        error_id=E_EXEMPT_NETWORKS,
        type_error_id=E_EXEMPT_NETWORKS,
        hint='CIDRs never counted by any rule, e.g. ["10.0.0.0/8", "2001:db8::/32"].',
    )
    TIME_ZONE = Setting[str](
        "UTC",
        (str,),
        error_id=E_TIME_ZONE,
        type_error_id=E_TIME_ZONE,
        hint="The IANA name of the zone where weeks and months start, e.g. 'Europe/Berlin'.",
    )
    BLOCK_CACHE = Setting[bool](True, (bool,))
    BLOCK_MEMORY = Setting[int](
        86400,
        (int,),
        minimum=0,
        hint="Seconds a client's block level is remembered after its last block ended: a "
        "rule with block_growth blocks it that many times longer when it comes back sooner.",
    )
    MAX_DELAYED = Setting["int | str"](
        "auto",
        (int, str),
        minimum=0,
        choices=("auto",),
        hint="How many requests one process holds at once for delay rules; past it they are "
        "rejected with 429 at once. 0 rejects instead of delaying. 'auto': at most 10, and "
        "at most half the threads the process was seen serving with at once (at least 1).",
    )
    MAX_DELAYED_PER_CLIENT = Setting["int | None"](
        1,
        (int, type(None)),
        minimum=1,
        hint="How many requests of one client (one key of a delay rule) one process holds "
        "at once in its threads; past it they are rejected with 429 at once. None: no cap.",
    )
    CLUSTER_URL = Setting["str | None"](
        None,
        (str, type(None)),
        hint='The URL of any node of the cluster: "redis://host:7000", or rediss:// for TLS.',
    )
    NEAR_LIMIT_RATIO = Setting[float](
        0.8,
        _NUMBER,
        convert=float,
        minimum=0,
        above=True,
        maximum=1,
        hint="The share of a rule's limit past which an admitted request is counted in "
        "django_throttle_near_limit_total, e.g. 0.8; 1 counts only the last one admitted.",
    )
    # Its values are checked in checks.py: a choice list here holds strings only.
    METRICS = Setting["bool | str"](
        "auto",
        (bool, str),
        hint="True, False, or 'auto': Prometheus metrics when prometheus_client is installed.",
    )

    @classmethod
    def declared(cls) -> dict[str, Setting[Any]]:
        """Every setting, by name, in declaration order."""
        return {name: v for name, v in vars(cls).items() if isinstance(v, Setting)}

    @property
    def cache_backend_path(self) -> str | None:
        """Dotted path of the BACKEND of the configured cache, None if the alias is unknown."""
        cache = getattr(settings, "CACHES", {}).get(self.CACHE)
        return None if cache is None else str(cache.get("BACKEND", ""))

    @property
    def uses_redis(self) -> bool:
        """Whether decisions go to Redis (else the in-process memory backend)."""
        backend = self.BACKEND
        if backend != "memory" and self.CLUSTER_URL:
            return True
        if backend == "auto":
            path = self.cache_backend_path or ""
            return path.startswith(REDIS_CACHE_PREFIX)
        return backend == "redis"


conf = Settings()
