"""Key functions the tests register in DJANGO_THROTTLE['KEY_FUNCTIONS']."""


def tenant(request):
    return request.headers.get("X-Tenant") or None


def broken(request):
    raise RuntimeError("this key function always fails")
