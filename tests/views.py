"""Views the enforcement tests call: every decorator form and scope form."""

import asyncio
import threading
import time

from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.decorators import method_decorator
from django.views import View

from django_throttle import check, settle, throttle


def plain(request, **kwargs):
    return HttpResponse("plain")


@throttle("login")
def login(request):
    return HttpResponse("login")


@throttle("search", rate="3/m", key="ip")
def search(request):
    return HttpResponse("search")


@throttle("export", rate="10/m", cost=4)
def export(request):
    return HttpResponse("export")


@throttle("outer", rate="5/m")
@throttle("inner", rate="2/m")
def stacked(request):
    return HttpResponse("stacked")


@throttle("async-scope", rate="2/m")
async def async_view(request):
    return HttpResponse("async")


@method_decorator(throttle("class-scope", rate="2/m"), name="dispatch")
class ClassView(View):
    def get(self, request):
        return HttpResponse("class")


def failed_login(request):
    decision = check(request, "failed-login")
    return JsonResponse({"allowed": decision.allowed, "remaining": decision.remaining})


@throttle("heavy", rate="10/m", cost=lambda request: int(request.GET.get("n", "1")))
def heavy(request):
    return HttpResponse("heavy")


@throttle("orders")
def orders(request):
    return HttpResponse("orders")


@throttle("checked", rate="5/m")
def checked(request):
    """Decorated, and checks its own scope again, as a view might."""
    decision = check(request, "checked")
    return JsonResponse({"allowed": decision.allowed, "remaining": decision.remaining})


def custom_rejection(request, decision):
    """A REJECTION_VIEW: takes the request and the Decision."""
    return HttpResponse(f"slow down ({decision.rule})", status=429, content_type="text/plain")


@throttle("windowed", rate="2/15m")
def windowed(request):
    return HttpResponse("windowed")


# -- requests in flight (concurrency rules on /inflight/) ----------------------------------

HOLD = threading.Event()  # set by the test to let held requests finish


def inflight_held(request):
    HOLD.wait(10)
    return HttpResponse("done")


def inflight_streaming(request):
    def body():
        yield b"first "
        HOLD.wait(10)
        yield b"last"

    return StreamingHttpResponse(body())


def inflight_raising(request):
    raise RuntimeError("a view that fails")


def inflight_etag(request):
    response = HttpResponse("cached")
    response["ETag"] = '"v1"'
    return response


async def inflight_async(request):
    return HttpResponse("done")


async def inflight_async_slow(request):
    await asyncio.sleep(5)  # the tests' clients go away long before
    return HttpResponse("done")


# -- behind a real server (tests/served.py) -------------------------------------------------

SLOW_SECONDS = 2.0


def inflight_slow(request):
    """A slow sync view that records in Redis how many of it are running at once."""
    from django_redis import get_redis_connection

    redis = get_redis_connection("default")
    redis.rpush("views:seen", redis.incr("views:running"))
    try:
        time.sleep(SLOW_SECONDS)
    finally:
        redis.decr("views:running")
    return HttpResponse("done")


@throttle("slow-view")
def slow_decorated(request):
    """inflight_slow, throttled by its decorator alone (a server without the middleware)."""
    return inflight_slow(request)


def late_check(request):
    """A sync view that takes a concurrency slot itself (check()) after its client has left."""
    time.sleep(0.3)
    decision = check(request, "inview")
    time.sleep(0.2)
    return HttpResponse("ok" if decision.allowed else "no")


def delayed(request):
    """When the store admitted this request (its clock) and how long it was held."""
    from django_throttle.engine import state_of

    decision = state_of(request).shown
    assert decision is not None
    return JsonResponse({"decided_at": decision.decided_at, "delay": decision.delay})


def store_now(request):
    """The store's clock now: when this (unthrottled) request was served."""
    from django_redis import get_redis_connection

    seconds, micros = get_redis_connection("default").time()
    return JsonResponse({"now": seconds + micros / 1_000_000})


def llm_stream(request, tokens):
    """A completion streamed a token at a time, its cost settled as the last chunk is made
    (tests/test_settlements.py, under real servers)."""

    def completion():
        for _ in range(tokens):
            yield b"t "
        settle(request, tokens)

    return StreamingHttpResponse(completion())
