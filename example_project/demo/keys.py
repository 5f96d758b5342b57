"""A key function registered in DJANGO_THROTTLE['KEY_FUNCTIONS'] as 'api_key'."""

from django.http import HttpRequest


def api_key(request: HttpRequest) -> str | None:
    """Key API clients by their X-Api-Key header; requests without one are not counted."""
    return request.headers.get("X-Api-Key") or None
