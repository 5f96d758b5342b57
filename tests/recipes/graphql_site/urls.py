"""The route the prose of docs/usage.md gives schema.py (this file is not a block of the docs)."""

from django.urls import path
from strawberry.django.views import AsyncGraphQLView

from .schema import schema

urlpatterns = [path("graphql/", AsyncGraphQLView.as_view(schema=schema))]
