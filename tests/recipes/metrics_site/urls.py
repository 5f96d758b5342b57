# urls.py: the project's URLs, with a view of its own for /metrics
from django.http import HttpResponse
from django.urls import path
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest


def metrics(request):
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


urlpatterns = [
    # ...
    path("metrics", metrics),
]
