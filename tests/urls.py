from django.contrib import admin
from django.urls import include, path

from django_throttle.views import status
from tests import views

app_patterns = (
    [path("named/", views.plain, name="named")],
    "shop",
)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("plain/", views.plain, name="plain"),
    path("api/items/", views.plain, name="api-items"),
    path("users/<int:pk>/", views.plain, name="user-detail"),
    path("login/", views.login, name="login-page"),
    path("search/", views.search, name="search"),
    path("export/", views.export, name="export"),
    path("stacked/", views.stacked, name="stacked"),
    path("async/", views.async_view, name="async"),
    path("class/", views.ClassView.as_view(), name="class"),
    path("failed-login/", views.failed_login, name="failed-login"),
    path("shop/", include(app_patterns)),
    path("heavy/", views.heavy, name="heavy"),
    path("api/orders/", views.orders, name="api-orders"),
    path("checked/", views.checked, name="checked-page"),
    path("windowed/", views.windowed, name="windowed-page"),
    path("inflight/held/", views.inflight_held, name="inflight-held"),
    path("inflight/streaming/", views.inflight_streaming, name="inflight-streaming"),
    path("inflight/raising/", views.inflight_raising, name="inflight-raising"),
    path("inflight/async/", views.inflight_async, name="inflight-async"),
    path("inflight/etag/", views.inflight_etag, name="inflight-etag"),
    path("inflight/async-slow/", views.inflight_async_slow, name="inflight-async-slow"),
    path("inflight/slow/", views.inflight_slow, name="inflight-slow"),
    path("slow/decorated/", views.slow_decorated, name="slow-decorated"),
    path("late-check/", views.late_check, name="late-check"),
    path("delayed/", views.delayed, name="delayed"),
    path("store-now/", views.store_now, name="store-now"),
    path("llm/stream/<int:tokens>/", views.llm_stream, name="llm-stream"),
    path("throttle/status/", status, name="throttle-status"),
]

try:
    from tests.drf_views import DecoratedAPI, DefaultedAPI, DualAPI, FreeAPI, OrdersAPI
except ImportError:  # DRF is optional; its test is skipped without it
    pass
else:
    urlpatterns += [
        path("drf/orders/", OrdersAPI.as_view(), name="drf-orders-page"),
        path("drf/dual/", DualAPI.as_view(), name="drf-dual"),
        path("drf/defaulted/", DefaultedAPI.as_view(), name="drf-defaulted"),
        path("drf/free/", FreeAPI.as_view(), name="drf-free"),
        path("drf/decorated/<int:pk>/", DecoratedAPI.as_view(), name="drf-decorated"),
    ]

try:
    from tests.ninja_api import api as ninja_api
except ImportError:  # django-ninja is optional; its tests are skipped without it
    pass
else:
    urlpatterns += [path("ninja/", ninja_api.urls)]
