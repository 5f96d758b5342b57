"""The built wheel carries everything the app needs at run time."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_throttle"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    outdir = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (path,) = outdir.glob("django_throttle_rules-*.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive


@pytest.mark.parametrize(
    "name",
    [
        "django_throttle/__init__.py",
        "django_throttle/migrations/0001_initial.py",
        "django_throttle/templates/django_throttle/429.html",
        "django_throttle/static/django_throttle/admin.css",
        "django_throttle/static/django_throttle/dashboard.css",
        "django_throttle/templates/admin/django_throttle/dashboard.html",
        "django_throttle/templates/admin/django_throttle/dashboard_key.html",
        "django_throttle/templates/admin/django_throttle/rule/change_list.html",
        "django_throttle/templates/admin/django_throttle/rule/import.html",
        "django_throttle/templates/admin/django_throttle/rule/import_rules.html",
        "django_throttle/static/django_throttle/rule_form.js",
        "django_throttle/py.typed",
    ],
)
def test_wheel_carries_package_data(wheel, name):
    assert name in wheel.namelist()


def test_wheel_carries_every_template(wheel):
    """The admin pages include and extend templates of their own: each must ship."""
    templates = {p.relative_to(ROOT).as_posix() for p in PACKAGE.glob("templates/**/*.html")}
    assert "django_throttle/templates/admin/django_throttle/dashboard_table.html" in templates
    assert templates <= set(wheel.namelist())


LANGUAGES = ("ko", "ja", "zh_Hans", "de", "fr", "es", "pt_BR")


@pytest.mark.parametrize("language", LANGUAGES)
def test_wheel_carries_the_compiled_catalogue_and_its_source(wheel, language):
    catalogue = f"django_throttle/locale/{language}/LC_MESSAGES/django"
    assert {f"{catalogue}.mo", f"{catalogue}.po"} <= set(wheel.namelist())
    assert wheel.read(f"{catalogue}.mo") == (ROOT / f"{catalogue}.mo").read_bytes()


def test_wheel_carries_every_lua_script(wheel):
    sources = sorted(p.relative_to(ROOT).as_posix() for p in PACKAGE.glob("**/lua/*.lua"))
    assert {s.split("/")[1] for s in sources} == {"store"}  # every script in store/lua/
    missing = set(sources) - set(wheel.namelist())
    assert not missing


def metadata_dir(wheel: zipfile.ZipFile) -> str:
    (name,) = {n.split("/")[0] for n in wheel.namelist() if ".dist-info/" in n}
    return name


def test_wheel_carries_only_the_package(wheel):
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert tops == {"django_throttle", metadata_dir(wheel)}


def test_wheel_metadata_names_the_distribution_and_its_requirements(wheel):
    metadata = Parser().parsestr(wheel.read(f"{metadata_dir(wheel)}/METADATA").decode())
    assert metadata["Name"] == "django-throttle-rules"
    # Requirements of an extra (hiredis, test, dev) are not installed with the package.
    runtime = [
        req.replace(" ", "")
        for req in metadata.get_all("Requires-Dist") or []
        if "extra" not in req
    ]
    assert "django>=5.2" in runtime
    names = {req.split(">")[0].split("=")[0].split("<")[0].lower() for req in runtime}
    assert {"django", "django-redis", "redis"} <= names


def test_wheel_requires_google_re2(wheel):
    """Every regex scope is matched by RE2: google-re2 is installed with the package."""
    metadata = Parser().parsestr(wheel.read(f"{metadata_dir(wheel)}/METADATA").decode())
    runtime = [r for r in metadata.get_all("Requires-Dist") or [] if "extra" not in r]
    assert any(r.replace(" ", "").startswith("google-re2>=") for r in runtime), runtime
