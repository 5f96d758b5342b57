from django.contrib import admin
from django.urls import path

from example_project.demo import views

urlpatterns = [
    path("", views.home, name="home"),
    path("api/items/", views.api_items, name="api-items"),
    path("items/<int:pk>/", views.item_detail, name="item-detail"),
    path("login/", views.login_view, name="login"),
    path("search/", views.search, name="search"),
    path("export/", views.export, name="export"),
    path("report/", views.report, name="report"),
    path("orders/", views.Orders.as_view(), name="orders"),
    path("admin/", admin.site.urls),
]
