"""A Strawberry schema under ThrottleExtension, served by strawberry's sync and async Django
views (the URLconf of tests/test_strawberry.py)."""

from __future__ import annotations

import strawberry
from django.urls import path
from graphql import DocumentNode
from strawberry.django.views import AsyncGraphQLView, GraphQLView

from django_throttle.contrib.strawberry import ThrottleExtension

RESOLVED: list[str] = []  # the resolvers that ran, in order


@strawberry.type
class User:
    id: int
    name: str

    @strawberry.field
    def friends(self, first: int = 10) -> list[User]:
        RESOLVED.append("friends")
        return [User(id=n, name=f"friend {n}") for n in range(first)]


@strawberry.type
class Query:
    @strawberry.field
    def users(self, first: int = 10) -> list[User]:
        RESOLVED.append("users")
        return [User(id=n, name=f"user {n}") for n in range(first)]

    @strawberry.field
    def me(self) -> User:
        RESOLVED.append("me")
        return User(id=0, name="me")


def ten(document: DocumentNode) -> int:
    return 10


schema = strawberry.Schema(Query, extensions=[ThrottleExtension(scope="graphql")])
flat_schema = strawberry.Schema(Query, extensions=[ThrottleExtension(scope="gql-flat", cost=ten)])

urlpatterns = [
    path("graphql/", GraphQLView.as_view(schema=schema)),
    path("agraphql/", AsyncGraphQLView.as_view(schema=schema)),
    path("flat/", GraphQLView.as_view(schema=flat_schema)),
]
