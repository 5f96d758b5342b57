"""System checks: each id fires on the settings it is about, and not on good ones."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_throttle.checks import check_middleware, check_settings

LOCMEM = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"
THROTTLE = "django_throttle.middleware.ThrottleMiddleware"


def settings_ids(**throttle: Any) -> list[str]:
    with override_settings(DJANGO_THROTTLE=throttle):
        return [message.id for message in check_settings()]


def test_default_settings_pass():
    assert check_settings() == []
    assert check_middleware() == []


def test_missing_setting_passes():
    with override_settings():
        del settings.DJANGO_THROTTLE
        assert check_settings() == []


def test_every_setting_given_well_passes():
    assert (
        settings_ids(
            CACHE="default",
            BACKEND="redis",
            FAIL_OPEN=False,
            TRUSTED_PROXIES=2,
            IPV6_PREFIX=56,
            RULES_REFRESH=0,
            HEADERS=False,
            KEY_FUNCTIONS={"tenant": "tests.keys.tenant"},
            KEY_PREFIX="app1",
        )
        == []
    )


@pytest.mark.parametrize("value", [None, [], "FAIL_OPEN", ("CACHE", "default")])
def test_e001_setting_not_a_dict(value):
    with override_settings(DJANGO_THROTTLE=value):
        messages = check_settings()
    assert [m.id for m in messages] == ["django_throttle.E001"]
    assert f"must be a dict, not {type(value).__name__}" in messages[0].msg


def test_e002_unknown_cache_alias():
    assert settings_ids(CACHE="throttle") == ["django_throttle.E002"]


def test_e002_not_raised_for_a_known_alias():
    with override_settings(CACHES={**settings.CACHES, "throttle": LOCMEM}):
        assert "django_throttle.E002" not in settings_ids(CACHE="throttle")


def test_w002_limits_per_process_without_django_redis_outside_debug():
    # Django's default cache, no django-redis: decisions fall back to each process's memory.
    with override_settings(CACHES={"default": LOCMEM}):
        messages = check_settings()
        assert [m.id for m in messages] == ["django_throttle.W002"]
        assert "each process's memory" in messages[0].msg
        with override_settings(DEBUG=True):  # the runserver of a developer: no noise
            assert settings_ids() == []
        assert settings_ids(BACKEND="memory") == []  # per-process limits chosen on purpose
    assert settings_ids() == []  # the test settings use django-redis


def test_e003_redis_backend_on_a_cache_that_is_not_django_redis():
    with override_settings(CACHES={**settings.CACHES, "local": LOCMEM}):
        assert settings_ids(CACHE="local", BACKEND="redis") == ["django_throttle.E003"]
        assert settings_ids(CACHE="local", BACKEND="auto") == ["django_throttle.W002"]
        assert settings_ids(CACHE="local", BACKEND="memory") == []
    assert settings_ids(CACHE="default", BACKEND="redis") == []


@pytest.mark.parametrize("backend", ["Redis", "memcached", ""])
def test_e004_unknown_backend(backend):
    assert settings_ids(BACKEND=backend) == ["django_throttle.E004"]


@pytest.mark.parametrize("backend", ["auto", "redis", "memory"])
def test_e004_not_raised_for_known_backends(backend):
    assert settings_ids(BACKEND=backend) == []


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CACHE", 0),
        ("BACKEND", None),
        ("FAIL_OPEN", "yes"),
        ("FAIL_OPEN", 1),
        ("IPV6_PREFIX", "64"),
        ("IPV6_PREFIX", True),
        ("IPV6_PREFIX", 64.0),
        ("RULES_REFRESH", "1"),
        ("RULES_REFRESH", False),
        ("HEADERS", None),
        ("KEY_FUNCTIONS", ["tests.keys.tenant"]),
        ("KEY_PREFIX", b"thr"),
    ],
)
def test_e005_wrong_type(name, value):
    with override_settings(DJANGO_THROTTLE={name: value}):
        messages = check_settings()
    assert [m.id for m in messages] == ["django_throttle.E005"]
    assert f"['{name}'] must be of type" in messages[0].msg


def test_e005_lists_every_wrong_type():
    ids = settings_ids(FAIL_OPEN="no", HEADERS=0)
    assert ids == ["django_throttle.E005", "django_throttle.E005"]


@pytest.mark.parametrize("value", [-1, True, False, "1", 1.0, None])
def test_e006_trusted_proxies_not_a_whole_number(value):
    with override_settings(DJANGO_THROTTLE={"TRUSTED_PROXIES": value}):
        messages = check_settings()
    assert [m.id for m in messages] == ["django_throttle.E006"]
    assert f"not {value!r}" in messages[0].msg


@pytest.mark.parametrize("value", [0, 1, 3])
def test_e006_not_raised_for_whole_numbers(value):
    assert settings_ids(TRUSTED_PROXIES=value) == []


def test_e007_middleware_before_authentication():
    with override_settings(
        MIDDLEWARE=[*settings.MIDDLEWARE[:3], THROTTLE, *settings.MIDDLEWARE[3:]]
    ):
        assert settings.MIDDLEWARE.index(THROTTLE) < settings.MIDDLEWARE.index(AUTH)
        assert [m.id for m in check_middleware()] == ["django_throttle.E007"]


def test_e007_not_raised_when_after_authentication():
    with override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, THROTTLE]):
        assert check_middleware() == []


def test_e007_not_raised_without_either_middleware():
    with override_settings(MIDDLEWARE=[THROTTLE]):
        assert check_middleware() == []
    with override_settings(MIDDLEWARE=[AUTH]):
        assert check_middleware() == []


@pytest.mark.parametrize("value", [-1, 129, 1000])
def test_e008_ipv6_prefix_out_of_range(value):
    assert settings_ids(IPV6_PREFIX=value) == ["django_throttle.E008"]


@pytest.mark.parametrize("value", [0, 48, 64, 128])
def test_e008_not_raised_in_range(value):
    assert settings_ids(IPV6_PREFIX=value) == []


@pytest.mark.parametrize("value", [-1, -0.5])
def test_e009_negative_rules_refresh(value):
    assert settings_ids(RULES_REFRESH=value) == ["django_throttle.E009"]


@pytest.mark.parametrize("value", [0, 0.2, 5])
def test_e009_not_raised_for_zero_or_more(value):
    assert settings_ids(RULES_REFRESH=value) == []


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("tests.keys.nothing", "does not define"),
        ("no_such_module.tenant", "No module named"),
        ("tenant", "doesn't look like a module path"),
        ("tests.settings.SECRET_KEY", "it is not callable"),
        (42, "it is not a dotted path"),
    ],
)
def test_e010_key_function_that_cannot_be_used(path, reason):
    with override_settings(DJANGO_THROTTLE={"KEY_FUNCTIONS": {"tenant": path}}):
        messages = check_settings()
    assert [m.id for m in messages] == ["django_throttle.E010"]
    assert "['KEY_FUNCTIONS']['tenant']" in messages[0].msg
    assert reason in messages[0].msg


def test_e010_reported_per_bad_function():
    functions = {"good": "tests.keys.tenant", "bad": "tests.keys.nothing", "worse": None}
    assert settings_ids(KEY_FUNCTIONS=functions) == ["django_throttle.E010"] * 2


@pytest.mark.parametrize("name", ["FAIL_CLOSED", "cache", "RATE"])
def test_w001_unknown_setting(name):
    with override_settings(DJANGO_THROTTLE={name: True}):
        messages = check_settings()
    assert [m.id for m in messages] == ["django_throttle.W001"]
    assert not messages[0].is_serious()
    assert repr(name) in messages[0].msg


def test_checks_are_registered_with_manage_py_check(capsys):
    call_command("check")
    assert "System check identified no issues" in capsys.readouterr().out


def test_manage_py_check_fails_on_a_bad_setting():
    with (
        override_settings(DJANGO_THROTTLE={"TRUSTED_PROXIES": True}),
        pytest.raises(SystemCheckError, match=r"django_throttle\.E006"),
    ):
        call_command("check")


def test_manage_py_check_fails_on_middleware_order():
    with (
        override_settings(MIDDLEWARE=[THROTTLE, *settings.MIDDLEWARE]),
        pytest.raises(SystemCheckError, match=r"django_throttle\.E007"),
    ):
        call_command("check")


def test_manage_py_check_reports_warnings_without_failing(capsys):
    with override_settings(DJANGO_THROTTLE={"FAIL_CLOSED": True}):
        call_command("check")
    assert "django_throttle.W001" in capsys.readouterr().err


def test_w001_for_each_unknown_key_even_when_not_strings():
    ids = settings_ids(**{"FAIL_CLOSED": True, "LIMIT": 5})
    assert ids == ["django_throttle.W001"] * 2
    with override_settings(DJANGO_THROTTLE={1: True, "RATE": "5/m"}):
        assert [m.id for m in check_settings()] == ["django_throttle.W001"] * 2


@pytest.mark.parametrize(
    ("throttle", "ids"),
    [
        ({"MAX_DELAYED": "auto"}, []),
        ({"MAX_DELAYED": 0}, []),
        ({"MAX_DELAYED": 4}, []),
        ({"MAX_DELAYED": "half"}, ["django_throttle.E009"]),
        ({"MAX_DELAYED": -1}, ["django_throttle.E009"]),
        ({"MAX_DELAYED": 2.5}, ["django_throttle.E005"]),
        ({"MAX_DELAYED_PER_CLIENT": None}, []),
        ({"MAX_DELAYED_PER_CLIENT": 3}, []),
        ({"MAX_DELAYED_PER_CLIENT": 0}, ["django_throttle.E009"]),
        ({"MAX_DELAYED_PER_CLIENT": "1"}, ["django_throttle.E005"]),
    ],
)
def test_the_caps_on_delayed_requests_are_validated(throttle, ids):
    assert settings_ids(**throttle) == ids
