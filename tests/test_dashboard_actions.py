"""Acting on a client from the dashboard (Block, Unblock, Exempt, Own limit) through the real
admin; block_key() from code; overrides that end."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone, translation

from django_throttle import ablock_key, block_key, check_key, reset
from django_throttle.models import Override
from django_throttle.runtime import replace_runtime
from tests.helpers import rule, run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_middleware")]

DASHBOARD = "/admin/django_throttle/dashboard/"
KEY = DASHBOARD + "key/"
IP, OTHER = "203.0.113.7", "198.51.100.4"
CLIENT = f"ip:{IP}"
ALGORITHMS = (
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
    "leaky_bucket",
    "concurrency",
)


def statuses(client: Any, ip: str, times: int) -> list[int]:
    return [client.get("/api/items/", REMOTE_ADDR=ip).status_code for _ in range(times)]


def user_with(django_user_model: Any, name: str, *perms: str) -> Client:
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    client = Client()
    client.force_login(user)
    return client


def action(rule_pk: int, what: str, **fields: Any) -> dict[str, Any]:
    return {"rule": rule_pk, "key": CLIENT, "action": what, **fields}


def rejected_once(scope: str = "/api/") -> None:
    """A rejection of CLIENT under the api rule, filed for the dashboard."""
    from django_throttle.rejection_log import flush

    client = Client()
    while client.get("/api/items/", REMOTE_ADDR=IP).status_code != 429:
        pass
    flush()


# -- permissions and CSRF ---------------------------------------------------------------------


def test_view_only_staff_sees_no_buttons_and_is_refused(django_user_model: Any) -> None:
    api = rule("api", "/api/", 1)
    rejected_once()
    support = user_with(django_user_model, "support", "django_throttle.view_dashboard")
    page = support.get(DASHBOARD).content.decode()
    assert CLIENT in page and "inspect" in page
    assert "throttle-actions" not in page
    key_page = support.get(f"{KEY}?rule={api.pk}&key={CLIENT}").content.decode()
    assert "throttle-block" not in key_page and "throttle-exempt" not in key_page
    for what, extra in (("block", {"seconds": 900}), ("exempt", {}), ("limit", {"limit": 9})):
        assert support.post(KEY, action(api.pk, what, **extra)).status_code == 403
    assert not Override.objects.exists()
    assert not LogEntry.objects.exists()
    assert statuses(Client(), IP, 1) == [429]  # the count left as it was, not blocked either


RULE_EDITOR = ("django_throttle.view_dashboard", "django_throttle.change_rule")
OVERRIDE_FORMS = ("throttle-exempt", "throttle-own-limit")


def pages(client: Client, api_pk: int) -> list[str]:
    """The dashboard (a top client's Act menu) and the client's key page."""
    return [
        client.get(DASHBOARD).content.decode(),
        client.get(f"{KEY}?rule={api_pk}&key={CLIENT}").content.decode(),
    ]


def test_a_rule_editor_without_override_permissions_may_block_but_not_exempt(
    django_user_model: Any,
) -> None:
    api = rule("api", "/api/", 1)
    rejected_once()
    editor = user_with(django_user_model, "editor", *RULE_EDITOR)
    for page in pages(editor, api.pk):
        assert "throttle-block" in page
        assert not any(name in page for name in OVERRIDE_FORMS)
    for what, extra in (("exempt", {}), ("limit", {"limit": 1_000_000})):
        assert editor.post(KEY, action(api.pk, what, **extra)).status_code == 403
    assert not Override.objects.exists()
    assert not LogEntry.objects.exists()
    assert editor.post(KEY, action(api.pk, "block", seconds=900)).status_code == 302


def test_making_an_override_takes_add_and_replacing_it_change(django_user_model: Any) -> None:
    api = rule("api", "/api/", 1)
    rejected_once()
    adder = user_with(django_user_model, "adder", *RULE_EDITOR, "django_throttle.add_override")
    for page in pages(adder, api.pk):
        assert all(name in page for name in OVERRIDE_FORMS)
    assert adder.post(KEY, action(api.pk, "exempt")).status_code == 302
    assert Override.objects.get(rule=api, key=CLIENT).exempt
    # The client has an override now: replacing it is a change, which this user may not make.
    for page in pages(adder, api.pk):
        assert not any(name in page for name in OVERRIDE_FORMS)
    assert adder.post(KEY, action(api.pk, "limit", limit=1_000_000)).status_code == 403
    override = Override.objects.get(rule=api, key=CLIENT)
    assert (override.exempt, override.limit) == (True, None)

    changer = user_with(
        django_user_model, "changer", *RULE_EDITOR, "django_throttle.change_override"
    )
    for page in pages(changer, api.pk):
        assert all(name in page for name in OVERRIDE_FORMS)
    assert changer.post(KEY, action(api.pk, "limit", limit=7)).status_code == 302
    override = Override.objects.get(rule=api, key=CLIENT)
    assert (override.exempt, override.limit) == (False, 7)


def test_actions_need_a_csrf_token(admin_user: Any) -> None:
    api = rule("api", "/api/", 5)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin_user)
    refused = browser.post(KEY, action(api.pk, "block", seconds=900))
    assert refused.status_code == 403
    assert statuses(Client(), IP, 1) == [200]
    page = browser.get(f"{KEY}?rule={api.pk}&key={CLIENT}").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    done = browser.post(
        KEY, action(api.pk, "block", seconds=900, csrfmiddlewaretoken=token.group(1))
    )
    assert done.status_code == 302
    assert statuses(Client(), IP, 1) == [429]


# -- the actions --------------------------------------------------------------------------------


def test_block_rejects_with_retry_after_and_unblock_ends_it(admin_client: Any) -> None:
    api = rule("api", "/api/", 5)
    assert statuses(Client(), IP, 1) == [200]
    back = f"{DASHBOARD}?period=1h"
    response = admin_client.post(KEY, action(api.pk, "block", seconds=3600, next=back))
    assert response.status_code == 302 and response["Location"] == back
    (entry,) = LogEntry.objects.all()
    assert (entry.action_flag, entry.object_id) == (CHANGE, str(api.pk))
    assert entry.change_message == f"Blocked client key {CLIENT} for 1 hour."
    page = admin_client.get(back).content.decode()
    assert f"Client key {CLIENT} blocked for 1 hour under rule api." in page

    blocked = Client().get("/api/items/", REMOTE_ADDR=IP)
    assert blocked.status_code == 429
    assert 3590 <= int(blocked["Retry-After"]) <= 3600
    assert statuses(Client(), OTHER, 1) == [200]  # that client only
    key_page = admin_client.get(f"{KEY}?rule={api.pk}&key={CLIENT}").content.decode()
    assert re.search(r"blocked for 3[56]\d\d s", key_page)

    response = admin_client.post(KEY, action(api.pk, "unblock"))
    assert response.status_code == 302
    assert response["Location"] == f"{KEY}?rule={api.pk}&key={CLIENT.replace(':', '%3A')}"
    assert statuses(Client(), IP, 1) == [200]
    assert LogEntry.objects.latest("pk").change_message == (
        f"Reset the state of client key {CLIENT}."
    )


def test_block_without_a_time_or_with_another_is_refused(admin_client: Any) -> None:
    api = rule("api", "/api/", 5)
    for seconds in ("", "5", "forever"):
        response = admin_client.post(KEY, action(api.pk, "block", seconds=seconds), follow=True)
        assert response.status_code == 200
    assert statuses(Client(), IP, 1) == [200]
    assert not LogEntry.objects.exists()


def test_exempt_lets_the_client_through(
    admin_client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    api = rule("api", "/api/", 1)
    assert statuses(Client(), IP, 2) == [200, 429]
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(KEY, action(api.pk, "exempt", expires=""), follow=True)
    assert f"Exempted client key {CLIENT} from rule api." in response.content.decode()
    override = Override.objects.get(rule=api, key=CLIENT)
    assert (override.exempt, override.limit, override.expires_at) == (True, None, None)
    entry = LogEntry.objects.get()
    assert (entry.action_flag, entry.object_id) == (ADDITION, str(override.pk))
    assert statuses(Client(), IP, 5) == [200] * 5
    assert statuses(Client(), OTHER, 2) == [200, 429]


def test_own_limit_applies_and_replaces_an_exemption(
    admin_client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    api = rule("api", "/api/", 1, algorithm="fixed_window", unit="hour")
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(KEY, action(api.pk, "exempt"))
        admin_client.post(KEY, action(api.pk, "limit", limit=3, expires=86400))
    override = Override.objects.get(rule=api, key=CLIENT)
    assert (override.exempt, override.limit) == (False, 3)
    assert override.expires_at is not None
    assert timedelta(hours=23) < override.expires_at - timezone.now() <= timedelta(days=1)
    assert LogEntry.objects.latest("pk").action_flag == CHANGE
    assert statuses(Client(), IP, 4) == [200, 200, 200, 429]
    bad = admin_client.post(KEY, action(api.pk, "limit", limit=0), follow=True)
    assert bad.status_code == 200
    assert Override.objects.get(rule=api, key=CLIENT).limit == 3


def test_an_override_of_a_malformed_key_is_a_message_not_an_error(admin_client: Any) -> None:
    api = rule("api", "/api/", 1)
    fields = {"rule": api.pk, "key": "ip:not-an-address", "action": "exempt"}
    response = admin_client.post(KEY, fields, follow=True)
    assert response.status_code == 200
    assert "is not an IP address" in response.content.decode()
    assert not Override.objects.exists()


def test_code_default_rows_can_be_inspected_blocked_and_unblocked(admin_client: Any) -> None:
    from django_throttle.rejection_log import flush

    client = Client()
    while client.get("/search/", REMOTE_ADDR="192.0.2.44").status_code != 429:  # @throttle 3/m
        pass
    flush()
    page = admin_client.get(DASHBOARD).content.decode()
    assert f'href="{KEY}?scope=search&amp;key=ip%3A192.0.2.44"' in page
    assert 'name="scope" value="search"' in page
    fields = {"scope": "search", "key": "ip:192.0.2.44", "action": "unblock", "next": DASHBOARD}
    assert admin_client.post(KEY, fields).status_code == 302
    assert client.get("/search/", REMOTE_ADDR="192.0.2.44").status_code == 200
    fields.update(action="block", seconds=900)
    assert admin_client.post(KEY, fields).status_code == 302
    rejected = client.get("/search/", REMOTE_ADDR="192.0.2.44")
    assert rejected.status_code == 429 and 890 <= int(rejected["Retry-After"]) <= 900
    entry = LogEntry.objects.latest("pk")
    assert (entry.object_id, entry.object_repr) == ("search", "search (code default)")
    fields.update(action="exempt")
    refused = admin_client.post(KEY, fields, follow=True).content.decode()
    assert "Code defaults have no overrides" in refused


def test_block_says_it_is_per_rule_in_the_operators_language(admin_client: Any) -> None:
    """An operator reads Block as "keep this client out everywhere": the page says otherwise."""
    api = rule("api", "/api/", 5)
    page = admin_client.get(f"{KEY}?rule={api.pk}&key={CLIENT}").content.decode()
    note = re.search(
        r'class="throttle-block" value="Block">\s*<span class="help throttle-block-note">([^<]+)<',
        page,
    )
    assert note is not None
    assert note.group(1) == (
        "Under this rule only: the client's requests under other rules still pass."
    )
    with translation.override("ko"):
        korean = admin_client.get(f"{KEY}?rule={api.pk}&key={CLIENT}").content.decode()
    assert "이 규칙에서만 차단됩니다." in korean
    defaults = admin_client.get(f"{KEY}?scope=search&key={CLIENT}").content.decode()
    assert "Under these code defaults only" in defaults


# -- overrides that end -----------------------------------------------------------------------


def test_an_expired_override_is_ignored_and_shown_expired(
    admin_client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    api = rule("api", "/api/", 1)
    with django_capture_on_commit_callbacks(execute=True):
        Override.objects.create(
            rule=api, key=CLIENT, exempt=True, expires_at=timezone.now() - timedelta(minutes=1)
        )
        Override.objects.create(
            rule=api, key=f"ip:{OTHER}", exempt=True, expires_at=timezone.now() + timedelta(days=1)
        )
    assert statuses(Client(), IP, 2) == [200, 429]  # ended: the rule's limit
    assert statuses(Client(), OTHER, 3) == [200] * 3  # not yet
    listing = admin_client.get("/admin/django_throttle/override/").content.decode()
    assert listing.count(">expired<") == 1
    form = admin_client.get(f"/admin/django_throttle/rule/{api.pk}/change/").content.decode()
    assert form.count(">expired<") == 1


def test_an_override_ends_while_its_rules_are_loaded() -> None:
    from django_throttle.compiled import build_rule, with_overrides
    from django_throttle.engine import rule_for

    base = build_rule(id=1, name="api", algorithm="fixed_window", limit=1, period=60)
    now = timezone.now().timestamp()
    ruled, _ = with_overrides(
        base, [("a", None, True, now - 1), ("b", None, True, now + 60), ("c", 5, False)]
    )
    assert rule_for(ruled, "a") is ruled  # ended: the rule itself
    assert rule_for(ruled, "b") is None
    own = rule_for(ruled, "c")
    assert own is not None and own.limit == 5


# -- block_key() from code ------------------------------------------------------------------


@pytest.fixture(params=["redis", "memory"])
def backend(request: Any, settings: Any) -> str:
    if request.param == "memory":
        settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "BACKEND": "memory"}
    return str(request.param)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_block_key_rejects_under_every_algorithm(backend: str, algorithm: str) -> None:
    rule("partner", "partner-api", 5, algorithm=algorithm)
    rule("partner-daily", "partner-api", 1000, unit="day", algorithm=algorithm)
    assert check_key("partner-api", "partner:acme").allowed
    assert block_key("partner-api", "partner:acme", 600) == 2
    decision = check_key("partner-api", "partner:acme")
    assert not decision.allowed
    assert 595 <= decision.retry_after <= 600
    assert check_key("partner-api", "partner:other").allowed
    assert reset("partner-api", "partner:acme") == 2
    assert check_key("partner-api", "partner:acme").allowed


def test_block_key_under_code_defaults_and_async(backend: str) -> None:
    assert check_key("search", "ip:192.0.2.5").allowed  # tests/views.py: @throttle 3/m
    assert run(lambda: ablock_key("search", "ip:192.0.2.5", 120)) == 1
    decision = check_key("search", "ip:192.0.2.5")
    assert not decision.allowed and 115 <= decision.retry_after <= 120
    assert block_key("no-such-scope", "ip:192.0.2.5", 120) == 0


@pytest.mark.parametrize(
    ("scope", "key", "seconds"),
    [
        ("api", "partner:acme", 0),
        ("api", "partner:acme", -5),
        ("api", "partner:acme", 1.5),
        ("api", "partner:acme", True),
        ("api", "partner:acme", "60"),
        ("api", "partner:acme", 366 * 86400 + 1),
        ("", "partner:acme", 60),
        ("api", "", 60),
    ],
)
def test_block_key_refuses_bad_arguments(scope: Any, key: Any, seconds: Any) -> None:
    with pytest.raises(ValueError):
        block_key(scope, key, seconds)
    with pytest.raises(ValueError):
        run(lambda: ablock_key(scope, key, seconds))


def test_a_block_reaches_another_process_and_its_block_cache(store_calls: Any) -> None:
    """Another process (its own rules and block cache) is rejected for the block's time,
    remembers it (no store call for the next request) and forgets it on a reset here."""
    from tests.test_blocks import OtherProcess

    rule("partner", "partner-api", 100)
    other = OtherProcess()
    rules = other.rules()
    assert other.decide("partner-api", "partner:acme").allowed
    assert block_key("partner-api", "partner:acme", 300) == 1  # in this process
    first = other.decide("partner-api", "partner:acme")
    assert not first.allowed and 295 <= first.retry_after <= 300
    calls = store_calls.decisions
    again = other.decide("partner-api", "partner:acme")
    assert not again.allowed and 295 <= again.retry_after <= 300
    assert store_calls.decisions == calls and rules.blocked  # from its block cache
    reset("partner-api", "partner:acme")  # here
    assert other.later() is rules
    assert rules.blocked == {}
    assert other.decide("partner-api", "partner:acme").allowed


def test_a_block_is_seen_by_a_new_runtime() -> None:
    rule("partner", "partner-api", 100)
    block_key("partner-api", "partner:acme", 300)
    replace_runtime()  # another process: nothing in memory, the block in Redis
    assert not check_key("partner-api", "partner:acme").allowed


def commands_of(redis_client: Any, call: Any) -> dict[str, int]:
    """The Redis commands ``call()`` made, by name (commandstats, reset right before)."""
    redis_client.config_resetstat()
    call()
    stats = redis_client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}


def test_block_keys_are_read_only_while_a_block_may_live(redis_client: Any) -> None:
    """A rule without a block duration has its clients' block keys read only while a block of
    block_key() may live: the held key says so to every process (read with the rules version),
    and lives as long as the longest block."""
    from django_throttle.state_keys import held_key

    rule("partner", "partner-api", 100)
    assert check_key("partner-api", "partner:a").allowed  # the rules loaded
    reads = commands_of(redis_client, lambda: check_key("partner-api", "partner:a"))
    assert reads.get("pttl", 0) == 0

    block_key("partner-api", "partner:b", 600)
    block_key("partner-api", "partner:c", 60)  # a shorter block never shortens the held key
    assert 595_000 < redis_client.pttl(held_key()) <= 600_000
    reads = commands_of(redis_client, lambda: check_key("partner-api", "partner:a"))
    assert reads.get("pttl", 0) == 1

    replace_runtime()  # another process learns it when it reads the rules version
    assert not check_key("partner-api", "partner:b").allowed
    redis_client.delete(held_key())  # as when the longest block has ended
    replace_runtime()
    assert check_key("partner-api", "partner:a").allowed
    reads = commands_of(redis_client, lambda: check_key("partner-api", "partner:a"))
    assert reads.get("pttl", 0) == 0


def test_a_rule_with_a_block_duration_always_reads_its_block(redis_client: Any) -> None:
    rule("login", "/login/", 1, block_seconds=60)
    assert [check_key("/login/", "ip:192.0.2.9").allowed for _ in range(2)] == [True, False]
    replace_runtime()  # nothing held, nothing remembered: the rule's own block is read
    decided: list[Any] = []
    reads = commands_of(redis_client, lambda: decided.append(check_key("/login/", "ip:192.0.2.9")))
    assert reads.get("pttl", 0) == 1
    assert not decided[0].allowed and 55 <= decided[0].retry_after <= 60


def test_a_blocked_request_is_rejected_before_the_view(client: Any) -> None:
    rule("api", "/api/", 100)
    block_key("/api/", CLIENT, 60)
    response = client.get("/api/items/", REMOTE_ADDR=IP)
    assert response.status_code == 429
    assert 55 <= int(response["Retry-After"]) <= 60


# -- what a block belongs to ------------------------------------------------------------------


@pytest.mark.parametrize("started_by", ["rule", "block_key"])
def test_a_block_outlives_an_algorithm_or_limit_change_but_not_a_rename(
    backend: str, started_by: str, django_capture_on_commit_callbacks: Any
) -> None:
    """A block is the client's under the rule (its id and name): the admin changing the rule's
    algorithm or limit keeps it, changing them back keeps it, renaming the rule ends it."""
    login = rule("login", "login", 1, unit="hour", algorithm="fixed_window", block_seconds=60)
    if started_by == "rule":
        assert [check_key("login", CLIENT).allowed for _ in range(2)] == [True, False]
    else:
        assert block_key("login", CLIENT, 60) == 1

    def change(**fields: Any) -> None:
        for name, value in fields.items():
            setattr(login, name, value)
        with django_capture_on_commit_callbacks(execute=True):
            login.save()  # as the admin saves it: the rule cache hears of it

    def blocked() -> bool:
        [result] = check_key("login", CLIENT, dry_run=True).results
        return result.blocked and 50 < result.retry_after <= 60

    assert blocked()
    change(algorithm="token_bucket", limit=5)
    assert blocked()
    change(algorithm="sliding_window_log")
    assert blocked()
    change(algorithm="fixed_window", limit=1)
    assert blocked()
    change(name="login-renamed")
    assert not blocked()


def test_a_block_ends_with_its_rule_deleted(
    backend: str, django_capture_on_commit_callbacks: Any
) -> None:
    """A rule deleted and made again under the same name is a new rule: the block of the old
    one does not reject its clients."""
    login = rule("login", "login", 1, unit="hour", algorithm="fixed_window", block_seconds=60)
    assert [check_key("login", CLIENT).allowed for _ in range(2)] == [True, False]
    assert check_key("login", CLIENT, dry_run=True).results[0].blocked
    with django_capture_on_commit_callbacks(execute=True):
        login.delete()
    rule("login", "login", 5, unit="hour", algorithm="fixed_window", block_seconds=60)
    [result] = check_key("login", CLIENT, dry_run=True).results
    assert result.allowed and not result.blocked


def test_a_message_ends_in_one_full_stop_when_the_time_has_its_own(
    admin_client: Any, settings: Any
) -> None:
    """English dates end in "a.m." or "p.m.": the message adds no second full stop."""
    settings.DATETIME_FORMAT = "N j, Y, P"  # Django's English format: "6:30 a.m."
    settings.USE_I18N = False  # the format above, not the locale's
    api = rule("api", "/api/", 1, algorithm="fixed_window", unit="hour")
    response = admin_client.post(KEY, action(api.pk, "exempt", expires=3600), follow=True)
    texts = [str(m) for m in response.context["messages"]]
    assert texts and all(not text.endswith("..") for text in texts), texts
    assert any(text.endswith((".m.", "noon.", "midnight.")) for text in texts), texts
