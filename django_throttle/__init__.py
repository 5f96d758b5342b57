"""django_throttle: rate limiting for Django, with rules edited in the admin."""

__version__ = "0.1.0"
