"""Settings for the test suite. The Redis URL is filled in by the harness (tests/redis_server.py)."""

import os
import tempfile
from typing import Any

SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
USE_TZ = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_throttle",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "tests.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES: dict[str, dict[str, Any]]
if os.environ.get("THROTTLE_TEST_DB") == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("THROTTLE_TEST_PGDATABASE", "throttle"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
        }
    }
else:
    # A file, not ":memory:": Django never closes in-memory connections (closing would drop
    # the database), so threads that query (the rejection flusher) would leak theirs.
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": ":memory:",
            "TEST": {
                "NAME": os.path.join(tempfile.gettempdir(), f"throttle-tests-{os.getpid()}.sqlite3")
            },
        }
    }

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        # Replaced at start-up by the harness with the redis-server it runs (or REDIS_URL).
        "LOCATION": os.environ.get("REDIS_URL", "redis://127.0.0.1:1/0"),
    }
}

DJANGO_THROTTLE = {
    "RULES_REFRESH": 0.2,
    # A loaded CI machine can stall for more than the production default of 0.1 s; the
    # fault tests set short timeouts themselves.
    "TIMEOUT": 2.0,
    "CONNECT_TIMEOUT": 2.0,
    "KEY_FUNCTIONS": {"tenant": "tests.keys.tenant"},
}

STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
