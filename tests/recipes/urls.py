"""The routes docs/usage.md's prose gives its views: path("login/", views.login_view) for
accounts/views.py and path("chat/", views.complete) for chat/views.py (not a block of the docs)."""

from django.urls import path

from tests.recipes.chat_site.chat.views import complete
from tests.recipes.login_site.accounts.views import login_view

urlpatterns = [path("login/", login_view), path("chat/", complete)]
