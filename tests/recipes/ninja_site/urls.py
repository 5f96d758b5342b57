"""The route the first line of api.py gives (this file is not a block of docs/usage.md)."""

from django.urls import path

from .api import api

urlpatterns = [path("api/", api.urls)]
