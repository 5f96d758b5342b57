from django.contrib import admin
from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from django_throttle.views import status
from example_project.demo import views
from example_project.demo.api import api as ninja_api

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
    path("admin/", admin.site.urls),
]
