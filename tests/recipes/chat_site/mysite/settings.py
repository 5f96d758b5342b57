"""The settings docs/usage.md's asgi.py names, under a real server: the test suite's, with the
test's own database (tests/served.py passes it in THROTTLE_TEST_DATABASE)."""

import json
import os

from tests.settings import *  # noqa: F403

DATABASES = {
    "default": {k: v for k, v in json.loads(os.environ["THROTTLE_TEST_DATABASE"]).items() if v}
}
