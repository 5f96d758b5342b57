# schema.py: a schema whose operations are counted by their cost
import strawberry

from django_throttle.contrib.strawberry import ThrottleExtension


@strawberry.type
class User:
    id: int
    name: str


@strawberry.type
class Query:
    @strawberry.field
    def users(self, first: int = 10) -> list[User]:
        return [User(id=n, name=f"user {n}") for n in range(first)]


schema = strawberry.Schema(Query, extensions=[ThrottleExtension(scope="graphql")])
