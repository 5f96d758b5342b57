# urls.py: the project's URLs, with the status endpoint
from django.urls import path

from django_throttle.views import status

urlpatterns = [
    # ...
    path("throttle/status/", status),
]
