"""A GraphQL endpoint of the demo (Strawberry, /graphql/): each operation is counted once under
the rule "graphql", with the cost of the fields it asks for."""

from __future__ import annotations

import strawberry

from django_throttle.contrib.strawberry import ThrottleExtension

from .views import ITEMS


@strawberry.type
class Item:
    id: int
    name: str


@strawberry.type
class Query:
    @strawberry.field
    def items(self, first: int = 10) -> list[Item]:
        """{ items(first: 20) { id name } } costs 1 + 20 x 2 = 41."""
        return [Item(id=item["id"], name=item["name"]) for item in ITEMS[: max(0, first)]]


schema = strawberry.Schema(Query, extensions=[ThrottleExtension(scope="graphql")])
