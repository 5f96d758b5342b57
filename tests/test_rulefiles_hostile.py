"""throttle_import of hostile files: each is refused with a CommandError naming the problem,
quickly and in bounded memory, and the database is left as it was."""

from __future__ import annotations

import time
import tracemalloc
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

from django_throttle.management.rulefiles import MAX_FILE_BYTES
from django_throttle.models import Override, Rule
from tests.helpers import rule

pytestmark = pytest.mark.django_db

# A valid first rule, so a file that is refused later on would have written something.
FIRST_YAML = "rules:\n  - {name: first, scope: /first/, limit: 5}\n"
FIRST_JSON = '{"rules": [{"name": "first", "scope": "/first/", "limit": 5}, '

# The classic "billion laughs": 9 levels of 9, so 9**9 strings once expanded, in 416 bytes.
BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
rules:
  - {name: laughs, scope: /laughs/, limit: 1, exempt_networks: *i}
"""


@pytest.fixture(autouse=True, params=["libyaml", "pure-python"])
def yaml_parser(request: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file read with PyYAML's libyaml parser and, as on an install without libyaml,
    with its pure Python one."""
    if request.param == "pure-python":
        monkeypatch.delattr(yaml, "CSafeLoader")
    else:
        assert yaml.__with_libyaml__


@pytest.fixture
def tables() -> Any:
    """A rule with an override in the database; yields a function reading both tables."""
    api = rule("api", "/api/", 100)
    Override.objects.create(rule=api, key="user:42", limit=1000)

    def read() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return (
            list(Rule.objects.order_by("pk").values()),
            list(Override.objects.order_by("pk").values()),
        )

    return read


def refused(tmp_path: Path, name: str, content: str | bytes, tables: Any) -> str:
    """Import the file (with --prune, so even an empty import would delete the rule): it must
    be a CommandError that changed nothing; returns the message, lowercased."""
    path = tmp_path / name
    if isinstance(content, str):
        content = content.encode("utf-8", "surrogatepass")
    path.write_bytes(content)
    before = tables()
    with pytest.raises(CommandError) as info:
        call_command("throttle_import", str(path), "--prune", stdout=StringIO())
    assert tables() == before
    message = str(info.value)
    message.encode("utf-8")  # printable as it is: no lone surrogate in the message itself
    # Without the path (which holds the test's name) and the ending, the same for every file.
    assert message.startswith(f"{path}: ")
    assert message.endswith("; nothing was written.")
    return message[len(f"{path}: ") :].lower()


# -- encoding -------------------------------------------------------------------------


def test_bytes_that_are_not_utf8(tmp_path: Path, tables: Any) -> None:
    content = FIRST_YAML.encode() + b"  - {name: caf\xe9, scope: /cafe/, limit: 5}\n"
    message = refused(tmp_path, "rules.yaml", content, tables)
    assert "not utf-8" in message
    assert "line 3" in message


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("rules.json", FIRST_JSON + '{"name": "second", "scope": "/s\\ud800/", "limit": 5}]}'),
        ("rules.json", FIRST_JSON + '{"name": "se\\udfffcond", "scope": "/s/", "limit": 5}]}'),
        ("rules.yaml", FIRST_YAML + '  - {name: second, scope: "/s\\ud800/", limit: 5}\n'),
    ],
    ids=["json-value", "json-name", "yaml-value"],
)
def test_lone_surrogates(tmp_path: Path, tables: Any, name: str, content: str) -> None:
    message = refused(tmp_path, name, content, tables)
    # JSON names the surrogate; libyaml refuses the escape itself ("invalid Unicode character
    # escape code"), PyYAML's pure Python parser yields the surrogate, named as in JSON.
    assert "unicode" in message


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("rules.json", FIRST_JSON + '{"name": "second", "scope": "/s\\u0000/", "limit": 5}]}'),
        ("rules.yaml", FIRST_YAML + '  - {name: second, scope: "/s\\0/", limit: 5}\n'),
        ("rules.yaml", FIRST_YAML + '  - {name: second, scope: "/s/", limit: 5}\n\x00'),
        ("rules.json", FIRST_JSON + '{"name": "second", "scope": "/s/", "limit": 5}]}\x00'),
        (
            "rules.yaml",
            FIRST_YAML + '  - {name: second, scope: /s/, limit: 5, groups: ["a\\0"]}\n',
        ),
        (
            "rules.json",
            FIRST_JSON + '{"name": "second", "scope": "/s/", "limit": 5, '
            '"overrides": [{"key": "user:\\u0000", "limit": 9}]}]}',
        ),
    ],
    ids=["json-escape", "yaml-escape", "yaml-raw", "json-raw", "group-name", "override-key"],
)
def test_nul_characters(tmp_path: Path, tables: Any, name: str, content: str) -> None:
    assert "nul" in refused(tmp_path, name, content, tables)


# -- YAML's references ----------------------------------------------------------------


def test_the_billion_laughs_fails_fast_in_little_memory(tmp_path: Path, tables: Any) -> None:
    assert len(BILLION_LAUGHS) == 416
    tracemalloc.start()
    started = time.perf_counter()
    try:
        message = refused(tmp_path, "rules.yaml", BILLION_LAUGHS, tables)
        elapsed = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "anchor" in message
    assert "line 1" in message
    # The issue asks for "within a second"; a generous margin for a loaded machine.
    assert elapsed < 5
    assert peak < 50 * 2**20


@pytest.mark.parametrize(
    ("content", "word"),
    [
        (FIRST_YAML + "  - &second {name: second, scope: /s/, limit: 5}\n", "anchor"),
        # (an alias of no anchor was refused before too, as undefined)
        (FIRST_YAML + "  - {name: second, scope: *scope, limit: 5}\n", "alias"),
        (FIRST_YAML + "  - {name: second, scope: /s/, <<: {limit: 5}}\n", "merge"),
    ],
    ids=["anchor", "alias", "merge-key"],
)
def test_anchors_aliases_and_merge_keys(
    tmp_path: Path, tables: Any, content: str, word: str
) -> None:
    message = refused(tmp_path, "rules.yaml", content, tables)
    assert word in message
    assert "line 3" in message


# -- shapes and sizes -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("rules.json", FIRST_JSON + "[" * 100_000 + "]" * 100_000 + "]}"),
        ("rules.yaml", FIRST_YAML + "  - " + "[" * 100_000 + "]" * 100_000 + "\n"),
        ("rules.yaml", FIRST_YAML + "".join(f"{'  ' * i}-\n" for i in range(1, 40))),
    ],
    ids=["json", "yaml-flow", "yaml-block"],
)
def test_deep_nesting(tmp_path: Path, tables: Any, name: str, content: str) -> None:
    # libyaml stops a flow collection 1,000 deep itself ("exceeded maximum nesting depth").
    message = refused(tmp_path, name, content, tables)
    assert "nested deeper than 16 levels" in message or "maximum nesting depth" in message


@pytest.mark.parametrize(
    ("content", "words"),
    [
        # An unterminated string of escaped quotes: measured on the brackets outside strings,
        # it was scanned again from every quote (quadratic: days for 16 MiB).
        ('"' + '\\"' * 2_000_000, "unterminated string"),
        (FIRST_JSON + "[" * 10 + "]}", "brackets do not match"),
        (FIRST_JSON + '{"name": "s"}]}' + "]" * 3, "brackets do not match"),
    ],
    ids=["unterminated-string", "unclosed", "unopened"],
)
def test_broken_json_is_refused_in_linear_time(
    tmp_path: Path, tables: Any, content: str, words: str
) -> None:
    started = time.monotonic()
    message = refused(tmp_path, "rules.json", content, tables)
    assert words in message
    assert time.monotonic() - started < 5  # the bound is a second; a margin for CI


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("rules.json", FIRST_JSON + '{"name": "s", "limit": ' + "7" * 100_000 + "}]}", "digits"),
        ("rules.yaml", FIRST_YAML + "  - {name: s, limit: " + "7" * 100_000 + "}\n", "digits"),
        (
            "rules.yaml",
            FIRST_YAML + "  - {name: s, limit: 1" + ":10" * 100_000 + "}\n",
            "characters long",
        ),
        ("rules.json", FIRST_JSON + '{"name": "s", "limit": 1e999}]}', "not a finite number"),
        ("rules.yaml", FIRST_YAML + "  - {name: s, limit: 1.0e+999}\n", "not a finite number"),
        ("rules.json", FIRST_JSON + '{"name": "s", "limit": NaN}]}', "not a finite number"),
        ("rules.json", FIRST_JSON + '{"name": "s", "burst": -Infinity}]}', "not a finite number"),
        ("rules.yaml", FIRST_YAML + "  - {name: s, limit: .nan}\n", "not a finite number"),
        ("rules.yaml", FIRST_YAML + "  - {name: s, limit: -.inf}\n", "not a finite number"),
    ],
    ids=[
        "json-100k-digits",
        "yaml-100k-digits",
        "yaml-sexagesimal",
        "json-1e999",
        "yaml-1e999",
        "json-nan",
        "json-infinity",
        "yaml-nan",
        "yaml-infinity",
    ],
)
def test_huge_numbers(tmp_path: Path, tables: Any, name: str, content: str, words: str) -> None:
    message = refused(tmp_path, name, content, tables)
    assert "number" in message
    assert words in message


@pytest.mark.parametrize("name", ["rules.yaml", "rules.json"])
def test_a_file_over_the_size_cap(tmp_path: Path, tables: Any, name: str) -> None:
    empty = "rules: []\n" if name.endswith(".yaml") else '{"rules": []}'
    content = empty + " " * (MAX_FILE_BYTES + 1 - len(empty))
    message = refused(tmp_path, name, content, tables)
    assert f"larger than {MAX_FILE_BYTES // 2**20} mib" in message


# top-list, rules-mapping, rule-text, name-list, enabled-text and networks-mappings were
# refused before too; the others ended in a traceback, a message showing the whole value (of
# any size), or the import of a duplicate's last value.
@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("[]", 'a list under "rules"'),
        ("rules: {name: a}", 'a list under "rules"'),
        (FIRST_YAML + "  - just text\n", "rule 2 is not a mapping"),
        (FIRST_YAML + "  - {name: s, 1: x, b: y}\n", "field names are text"),
        (FIRST_YAML + "  - {name: s, [1]: x}\n", "keys are text"),
        (FIRST_YAML + "  - {name: [s]}\n", "rule 2 has no name"),
        (FIRST_YAML + "  - {name: s, scope: {a: [1, 2]}}\n", "scope: text, not a mapping"),
        (FIRST_YAML + "  - {name: s, limit: [5]}\n", "limit: a whole number, not a list"),
        (FIRST_YAML + "  - {name: s, enabled: yes please}\n", "enabled: true or false"),
        (FIRST_YAML + "  - {name: s, exempt_networks: [{a: 1}]}\n", "exempt_networks"),
        (FIRST_YAML + "  - {name: s, groups: [1]}\n", "groups must be a list of group names"),
        (FIRST_YAML + "  - {name: s, overrides: {key: a}}\n", "overrides must be a list"),
        (FIRST_YAML + "  - {name: s, overrides: [[key]]}\n", "an override is"),
        (FIRST_YAML + "  - {name: s, overrides: [{key: 4, limit: 1}]}\n", "an override is"),
        (FIRST_YAML + "  - {name: s, scope: !!binary aGVsbG8=}\n", "binary"),
        (FIRST_YAML + "  - {name: s, scope: /s/, scope: /t/}\n", "twice"),
        ("---\nrules: []\n---\nrules: []\n", "one yaml document"),
    ],
    ids=[
        "top-list",
        "rules-mapping",
        "rule-text",
        "mixed-field-names",
        "list-field-name",
        "name-list",
        "scope-mapping",
        "limit-list",
        "enabled-text",
        "networks-mappings",
        "group-number",
        "overrides-mapping",
        "override-list",
        "override-key-number",
        "binary-tag",
        "duplicate-field",
        "two-documents",
    ],
)
def test_wrong_types_at_any_level(tmp_path: Path, tables: Any, content: str, words: str) -> None:
    assert words in refused(tmp_path, "rules.yaml", content, tables)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        (
            "rules.json",
            '\ufeff{"rules": [{"name": "caf\\u00e9 \\ud83d\\ude00", "scope": "/c/", "limit": 5}]}',
        ),
        ("rules.yaml", '\ufeffrules:\n  - {name: "café \\U0001F600", scope: /c/, limit: 5}\n'),
    ],
    ids=["json", "yaml"],
)
def test_what_is_refused_is_only_what_must_be(tmp_path: Path, name: str, content: str) -> None:
    """A byte-order mark, escapes, and a character outside the BMP (a JSON surrogate pair)."""
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    call_command("throttle_import", str(path), stdout=StringIO())
    assert Rule.objects.get().name == "café \U0001f600"
