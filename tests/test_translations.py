"""The shipped catalogues: the 429 page and the admin in Korean, and no string left untranslated."""

from __future__ import annotations

import ast
import gettext
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.test import Client
from django.utils import translation

from django_throttle.management.rulefiles import import_rules, load
from django_throttle.models import Rule
from tests.external import require

PACKAGE = Path(__file__).resolve().parent.parent / "django_throttle"
LANGUAGES = ("ko", "ja", "zh_Hans", "de", "fr", "es", "pt_BR")
ADD = "/admin/django_throttle/rule/add/"
PLACEHOLDER = re.compile(r"%\(\w+\)[sdr]|\{\w*\}")


@pytest.fixture
def locale_middleware(settings: Any, throttle_middleware: None) -> Iterator[None]:
    """LocaleMiddleware where Django's docs put it: after sessions, before CommonMiddleware."""
    middleware = list(settings.MIDDLEWARE)
    sessions = middleware.index("django.contrib.sessions.middleware.SessionMiddleware")
    middleware.insert(sessions + 1, "django.middleware.locale.LocaleMiddleware")
    settings.MIDDLEWARE = middleware
    yield
    # The middleware leaves the last request's language active in this thread (the next
    # request would activate its own); later tests expect the default.
    translation.deactivate()


# -- through the real middleware and the real admin ------------------------------------


@pytest.mark.django_db
def test_the_429_page_speaks_the_clients_language(locale_middleware):
    Rule.objects.create(name="plain", scope="/plain/", limit=1)
    client = Client(HTTP_ACCEPT_LANGUAGE="ko")
    assert client.get("/plain/").status_code == 200
    response = client.get("/plain/")
    assert response.status_code == 429
    html = response.content.decode()
    assert "<h1>요청이 너무 많습니다</h1>" in html
    assert "요청을 너무 많이 보냈습니다." in html
    assert "Too many requests" not in html


@pytest.mark.django_db
def test_the_json_429_speaks_the_clients_language(locale_middleware):
    Rule.objects.create(name="plain", scope="/plain/", limit=1, unit="hour")
    client = Client(HTTP_ACCEPT_LANGUAGE="de", HTTP_ACCEPT="application/json")
    client.get("/plain/")
    response = client.get("/plain/")
    assert response.status_code == 429
    assert response.json()["detail"].startswith("Zu viele Anfragen. Bitte versuchen Sie es in ")


@pytest.mark.django_db
def test_without_a_language_the_429_page_stays_english(locale_middleware):
    Rule.objects.create(name="plain", scope="/plain/", limit=1)
    client = Client()
    client.get("/plain/")
    assert "<h1>Too many requests</h1>" in client.get("/plain/").content.decode()


@pytest.mark.django_db
def test_the_rule_form_in_korean(locale_middleware, admin_client):
    response = admin_client.get(ADD, HTTP_ACCEPT_LANGUAGE="ko")
    assert response.status_code == 200
    html = response.content.decode()
    assert "요청 제한 규칙" in html  # the model's name
    assert "헤더와 대시보드에 표시되는 고유한 이름입니다. 예: login." in html  # name's help text
    assert "저장소 장애 시" in html  # fail_mode's label
    assert ">토큰 버킷</option>" in html  # an algorithm choice
    assert "적용 대상 사용자" in html  # a fieldset


@pytest.mark.django_db
def test_the_rule_in_words_in_korean(locale_middleware, admin_client):
    rule = Rule.objects.create(
        name="login",
        scope="login",
        limit=5,
        per=15,
        unit="minute",
        block_seconds=3600,
        methods="POST",
        exempt_staff=True,
    )
    html = admin_client.get(
        f"/admin/django_throttle/rule/{rule.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko"
    ).content.decode()
    assert "클라이언트 IP별 15분당 최대 5회 요청, 이후 1시간 동안 차단; POST만; 스태프 제외" in html


# -- a rule in words, in every language ---------------------------------------------------

# English that the one-line form of a rule, the Key column and the import preview used to
# leave in the middle of a translated sentence.
ENGLISH = (" per ", "burst", "user_or_ip", "shared by all", "(disabled)", ", log", ", delay")
RULES_FILE = """
rules:
  - {name: r1, scope: /a/, key_kind: ip, limit: 10, algorithm: sliding_window_counter}
  - {name: r2, scope: /b/, key_kind: user_or_ip, limit: 5, unit: second,
     algorithm: token_bucket, burst: 2, action: log, enabled: false}
  - {name: r3, scope: /c/, key_kind: header, key_arg: X-Key, limit: 5, per: 15,
     algorithm: leaky_bucket, burst: 3, action: delay}
  - {name: r4, scope: /d/, key_kind: global, limit: 3, algorithm: concurrency}
  - {name: r5, scope: /e/, key_kind: user, limit: 3, unit: day, algorithm: fixed_window}
  - {name: r6, scope: /f/, key_kind: param, key_arg: q, limit: 3, algorithm: fixed_window}
"""


def visible(html: str) -> str:
    """The text of a page (attributes, scripts and styles left out)."""
    html = re.sub(r"(?s)<(script|style)\b.*?</\1>", " ", html)
    return re.sub(r"(?s)<[^>]*>", " ", html)


@pytest.mark.django_db
@pytest.mark.parametrize("language", ["ko", "ja", "zh-hans", "de", "fr", "es", "pt-br"])
def test_every_sentence_about_a_rule_is_in_the_language(locale_middleware, admin_client, language):
    preview = admin_client.post(
        "/admin/django_throttle/rule/import/",
        {"file": SimpleUploadedFile("rules.yaml", RULES_FILE.encode())},
        HTTP_ACCEPT_LANGUAGE=language,
    )
    assert preview.status_code == 200 and len(preview.context["created"]) == 6
    import_rules(load(RULES_FILE, "yaml"), prune=False, dry_run=False)
    pages = {
        "import preview": visible(preview.content.decode()),
        "rule list": visible(
            admin_client.get(
                "/admin/django_throttle/rule/", HTTP_ACCEPT_LANGUAGE=language
            ).content.decode()
        ),
        "dashboard": visible(
            admin_client.get(
                "/admin/django_throttle/dashboard/", HTTP_ACCEPT_LANGUAGE=language
            ).content.decode()
        ),
    }
    with translation.override(language):
        pages["one line"] = "\n".join(str(rule) for rule in Rule.objects.all())
    assert pages["one line"].count("\n") == 5
    found = {
        (where, fragment)
        for where, text in pages.items()
        for fragment in (*ENGLISH, " ip ")  # " ip ": the Key column's stored value
        if fragment in text
    }
    assert found == set()


# -- the catalogues themselves -----------------------------------------------------------


@dataclass
class Entry:
    msgid: str
    msgid_plural: str = ""
    msgctxt: str | None = None
    msgstr: dict[int, str] = field(default_factory=dict)
    fuzzy: bool = False


def read_po(path: Path) -> list[Entry]:
    """The entries of a .po file (the header and obsolete #~ entries left out)."""
    entries: list[Entry] = []
    for block in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
        fields: dict[str, str] = {}
        current = ""
        fuzzy = False
        for line in block.splitlines():
            if line.startswith("#,") and "fuzzy" in line:
                fuzzy = True
            if line.startswith("#"):
                continue
            match = re.match(r"^(msgctxt|msgid_plural|msgid|msgstr(?:\[\d+\])?) (\".*\")$", line)
            if match:
                current = match.group(1)
                fields[current] = ast.literal_eval(match.group(2))
            elif line.startswith('"'):
                fields[current] += ast.literal_eval(line)
        if not fields.get("msgid"):
            continue  # the header
        strs = {
            int(k[7:-1]) if k.startswith("msgstr[") else 0: v
            for k, v in fields.items()
            if k.startswith("msgstr")
        }
        entries.append(
            Entry(
                fields["msgid"], fields.get("msgid_plural", ""), fields.get("msgctxt"), strs, fuzzy
            )
        )
    return entries


def problems(entries: list[Entry]) -> list[str]:
    found = []
    for entry in entries:
        if entry.fuzzy:
            found.append(f"fuzzy: {entry.msgid!r}")
        if not entry.msgstr or not all(entry.msgstr.values()):
            found.append(f"untranslated: {entry.msgid!r}")
    return found


def po_path(root: Path, language: str) -> Path:
    return root / "locale" / language / "LC_MESSAGES" / "django.po"


@pytest.mark.parametrize("language", LANGUAGES)
def test_every_entry_is_translated_and_none_is_fuzzy(language):
    entries = read_po(po_path(PACKAGE, language))
    assert len(entries) > 250
    assert problems(entries) == []


@pytest.mark.parametrize("language", LANGUAGES)
def test_translations_keep_every_placeholder(language):
    for entry in read_po(po_path(PACKAGE, language)):
        source = entry.msgid_plural or entry.msgid
        wanted = sorted(PLACEHOLDER.findall(source))
        for form in entry.msgstr.values():
            # A singular form may say "one" rather than the number (English does not).
            found = sorted(PLACEHOLDER.findall(form))
            assert found == wanted or (entry.msgid_plural and set(found) < set(wanted)), (
                entry.msgid,
                form,
            )


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_compiled_catalogue_matches_its_source(language):
    """The .mo shipped is compiled from the .po as it stands (compilemessages was run)."""
    po = po_path(PACKAGE, language)
    with open(po.with_suffix(".mo"), "rb") as mo:
        compiled = gettext.GNUTranslations(mo)
    for entry in read_po(po):
        if entry.msgid_plural:  # no plural message here has a context
            many = compiled.ngettext(entry.msgid, entry.msgid_plural, 5)
            assert many == entry.msgstr[max(entry.msgstr)], entry.msgid
        elif entry.msgctxt:
            assert compiled.pgettext(entry.msgctxt, entry.msgid) == entry.msgstr[0]
        else:
            assert compiled.gettext(entry.msgid) == entry.msgstr[0], entry.msgid


def test_makemessages_leaves_no_string_untranslated(tmp_path, monkeypatch):
    """A string marked in the code or a template since the catalogues were last refreshed shows
    up here: refresh them with scripts/messages and translate what it adds."""
    require("gettext")
    copy = tmp_path / "django_throttle"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.mo"))
    monkeypatch.chdir(copy)
    call_command("makemessages", locale=list(LANGUAGES), no_obsolete=True, verbosity=0)
    catalogues = {language: read_po(po_path(copy, language)) for language in LANGUAGES}
    assert all(any(e.msgid == "Too many requests" for e in c) for c in catalogues.values())
    missing = {language: problems(entries) for language, entries in catalogues.items()}
    assert missing == dict.fromkeys(LANGUAGES, []), "run scripts/messages, translate what it adds"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("asked", "lang", "heading"),
    [
        ("ko", "ko", "요청이 너무 많습니다"),
        ("ja", "ja", None),
        ("zh-hans", "zh-hans", None),
        ("pt-br", "pt-br", None),
        ("de", "de", None),
        ("en", "en", "Too many requests"),
        ("it", "en", "Too many requests"),  # no Italian catalogue: the page is in English
    ],
)
def test_the_429_page_declares_its_language_without_the_i18n_context_processor(
    locale_middleware: None, settings: Any, asked: str, lang: str, heading: str | None
) -> None:
    processors = settings.TEMPLATES[0]["OPTIONS"]["context_processors"]
    assert "django.template.context_processors.i18n" not in processors  # as startproject
    Rule.objects.create(name="plain", scope="/plain/", limit=1)
    client = Client(HTTP_ACCEPT_LANGUAGE=asked)
    client.get("/plain/")
    html = client.get("/plain/").content.decode()
    assert f'<html lang="{lang}">' in html
    if heading is not None:
        assert f"<h1>{heading}</h1>" in html
