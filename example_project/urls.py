from django.contrib import admin
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView
from strawberry.django.views import AsyncGraphQLView

from django_throttle.views import status
from example_project.demo import views
from example_project.demo.api import api as ninja_api
from example_project.demo.schema import schema as graphql_schema

urlpatterns = [
    path("", views.home, name="home"),
    path("api/items/", views.api_items, name="api-items"),
    path("items/<int:pk>/", views.item_detail, name="item-detail"),
    path("login/", views.login_view, name="login"),
    path("search/", views.search, name="search"),
    path("export/", views.export, name="export"),
    path("report/", views.report, name="report"),
    path("orders/", views.Orders.as_view(), name="orders"),
    path("throttle/status/", status, name="throttle-status"),
    path("ninja/", ninja_api.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # An API for clients that send no CSRF token (strawberry's views leave CSRF to Django).
    # Named unlike the rule's scope: a rule matching the view's path or URL name would count
    # the request in the middleware (cost 1) before the extension could count its cost.
    path(
        "graphql/",
        csrf_exempt(AsyncGraphQLView.as_view(schema=graphql_schema)),
        name="graphql-endpoint",
    ),
    path("admin/", admin.site.urls),
]
