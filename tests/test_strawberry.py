"""ThrottleExtension: one decision per GraphQL operation, its cost read from the document,
through strawberry's own Django views against a real Redis."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client
from graphql import parse

from django_throttle.contrib.graphql_cost import MAX_COST, query_cost
from django_throttle.contrib.strawberry import ThrottleExtension
from tests import graphql_api
from tests.helpers import rule

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.graphql_api")]


@pytest.fixture(autouse=True)
def _resolved() -> None:
    graphql_api.RESOLVED.clear()


def cost(text: str, **variables: Any) -> int:
    return query_cost(parse(text), None, variables)


# -- the cost of a document --------------------------------------------------------------------


def test_a_field_costs_one_and_a_list_subtree_counts_once_per_item_asked_for() -> None:
    assert cost("{ me { id name } }") == 3
    assert cost("{ users(first: 50) { id name } }") == 1 + 50 * 2
    assert cost("{ users(first: 5) { id friends(first: 3) { id } } }") == 1 + 5 * (1 + 1 + 3 * 1)
    assert cost("{ users { id } }") == 2  # no page argument: one item


def test_the_page_size_comes_from_variables_too() -> None:
    text = "query Q($n: Int) { users(first: $n) { id name } }"
    assert cost(text, n=20) == 1 + 20 * 2
    assert cost(text) == 1 + 2  # a missing variable: one item
    assert cost(text, n=-5) == 1  # a negative page asks for no items
    assert cost(text, n="many") == 1 + 2  # malformed: the schema refuses it later


def test_fragments_count_where_spread_and_are_costed_once() -> None:
    text = "{ me { ...F } users(first: 2) { ...F ... on User { name } } } fragment F on User { id name }"
    assert cost(text) == (1 + 2) + (1 + 2 * (2 + 1))
    # A fragment spread many times, each spreading the one below: costed once each, so the
    # count is exact and the work stays linear in the document.
    levels = ["fragment L0 on User { id }"] + [
        f"fragment L{n} on User {{ ...L{n - 1} ...L{n - 1} }}" for n in range(1, 40)
    ]
    deep = "{ me { ...L39 } } " + " ".join(levels)
    assert cost(deep) == min(MAX_COST, 1 + 2**39)


def test_a_cycle_or_a_missing_fragment_ends_the_count() -> None:
    assert cost("{ me { ...A } } fragment A on User { id ...B } fragment B on User { ...A }") == 2
    assert cost("{ me { ...Nowhere } }") == 1


def test_the_named_operation_is_the_one_costed() -> None:
    text = "query A { me { id } } query B { users(first: 9) { id } }"
    assert query_cost(parse(text), "A") == 2
    assert query_cost(parse(text), "B") == 10
    assert query_cost(parse(text), "C") == 1


def test_bad_configuration_is_refused_where_it_is_written() -> None:
    with pytest.raises(ValueError, match="scope"):
        ThrottleExtension(scope="")
    with pytest.raises(ValueError, match="callable"):
        ThrottleExtension(cost=5)  # type: ignore[arg-type]


# -- one decision per operation ----------------------------------------------------------------


def post(client: Any, url: str, query: str, **extra: Any) -> Any:
    return client.post(url, {"query": query}, content_type="application/json", **extra)


def test_each_operation_takes_its_cost_and_a_rejected_one_runs_no_resolver() -> None:
    rule("graphql", "graphql", 25, unit="minute", algorithm="fixed_window")
    client = Client()
    query = "{ users(first: 5) { id name } }"  # 11
    first, second = post(client, "/graphql/", query), post(client, "/graphql/", query)
    assert [first.status_code, second.status_code] == [200, 200]
    assert len(json.loads(second.content)["data"]["users"]) == 5
    assert second["RateLimit"] == '"graphql";r=3;t=' + second["RateLimit"].split("t=")[1]
    assert graphql_api.RESOLVED == ["users", "users"]
    third = post(client, "/graphql/", query)  # 22 + 11 > 25
    body = json.loads(third.content)
    assert body["data"] is None
    (error,) = body["errors"]
    assert error["extensions"]["code"] == "THROTTLED"
    assert error["extensions"]["retry_after"] == int(third["Retry-After"]) >= 1
    assert "Too many requests" in error["message"]
    assert third["RateLimit-Policy"] == '"graphql";q=25;w=60'
    assert graphql_api.RESOLVED == ["users", "users"]  # the third ran nothing
    assert post(client, "/graphql/", "{ me { id } }").status_code == 200  # 22 + 2 fits
    assert graphql_api.RESOLVED[-1] == "me"


def test_the_async_view_awaits_the_same_decision() -> None:
    rule("graphql", "graphql", 5, unit="minute", algorithm="sliding_window_log")

    async def queries() -> list[Any]:
        client = AsyncClient()
        return [await post(client, "/agraphql/", "{ me { id name } }") for _ in range(3)]

    answers = async_to_sync(queries)()
    bodies = [json.loads(a.content) for a in answers]
    assert [b["data"] for b in bodies[:1]] == [{"me": {"id": 0, "name": "me"}}]
    assert bodies[1]["errors"][0]["extensions"]["code"] == "THROTTLED"  # 3 + 3 > 5
    assert graphql_api.RESOLVED == ["me"]
    assert "Retry-After" in answers[2]


def test_a_query_dearer_than_the_limit_is_refused_not_failed() -> None:
    rule("graphql", "graphql", 1000, unit="minute", algorithm="token_bucket")
    answer = post(Client(), "/graphql/", "{ users(first: 2000000000) { id } }")
    assert answer.status_code == 200
    assert json.loads(answer.content)["errors"][0]["extensions"]["code"] == "THROTTLED"
    assert graphql_api.RESOLVED == []


def test_a_cost_function_of_ones_own() -> None:
    rule("flat", "gql-flat", 25, unit="minute", algorithm="fixed_window")
    client = Client()
    codes = [
        "errors" in json.loads(post(client, "/flat/", "{ users(first: 99) { id } }").content)
        for _ in range(3)
    ]
    assert codes == [False, False, True]  # 10 each


def test_an_invalid_document_is_answered_by_validation_and_not_counted() -> None:
    rule("graphql", "graphql", 2, unit="minute", algorithm="fixed_window")
    client = Client()
    for _ in range(3):
        body = json.loads(post(client, "/graphql/", "{ nothing }").content)
        assert "THROTTLED" not in json.dumps(body)
    assert post(client, "/graphql/", "{ me { id } }").status_code == 200
    assert json.loads(post(client, "/graphql/", "{ me { id } }").content)["data"] is None


def test_a_store_outage_on_a_fail_closed_rule_is_a_graphql_error_not_a_500(
    settings: Any, redis_server: Any
) -> None:
    settings.DJANGO_THROTTLE = {
        **settings.DJANGO_THROTTLE,
        "TIMEOUT": 0.2,
        "CONNECT_TIMEOUT": 0.2,
        "BREAKER_INTERVAL": 0.5,
    }
    rule("graphql", "graphql", 100, unit="minute", fail_mode="closed")
    client = Client()
    assert post(client, "/graphql/", "{ me { id } }").status_code == 200  # rules loaded
    redis_server.pause()
    try:
        answer = post(client, "/graphql/", "{ me { id } }")
    finally:
        redis_server.resume()
    assert answer.status_code == 200
    (error,) = json.loads(answer.content)["errors"]
    assert error["extensions"]["code"] == "UNAVAILABLE"
    assert int(answer["Retry-After"]) == error["extensions"]["retry_after"]
    assert "RateLimit" not in answer  # an outage says nothing of the limit
    assert graphql_api.RESOLVED == ["me"]


# -- the example of docs/usage.md ---------------------------------------------------------------


@pytest.mark.urls("tests.recipes.graphql_site.urls")
def test_the_docs_schema_counts_each_operation_by_its_cost() -> None:
    rule("graphql", "graphql", 25, unit="minute", algorithm="fixed_window")
    client = Client()
    query = "{ users(first: 10) { id name } }"  # 1 + 10 x 2 = 21
    first = post(client, "/graphql/", query)
    assert first.status_code == 200
    assert [user["id"] for user in json.loads(first.content)["data"]["users"]] == list(range(10))
    second = post(client, "/graphql/", query)  # 21 + 21 > 25: no resolver runs
    body = json.loads(second.content)
    assert body["data"] is None and body["errors"][0]["extensions"]["code"] == "THROTTLED"
    assert int(second["Retry-After"]) >= 1
    third = post(client, "/graphql/", "{ users(first: 2) { id name } }")  # 21 + 5 > 25
    assert json.loads(third.content)["data"] is None
    fits = post(client, "/graphql/", "{ users(first: 1) { name } }")  # 21 + 2 fits
    assert json.loads(fits.content)["data"] == {"users": [{"name": "user 0"}]}
