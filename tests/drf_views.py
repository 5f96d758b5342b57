"""A Django REST framework view throttled by RuleThrottle (DRF is optional)."""

from django.utils.decorators import method_decorator
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle import throttle
from django_throttle.contrib.drf import RuleThrottle


class OrdersAPI(APIView):
    throttle_scope = "drf-orders"
    throttle_classes = [RuleThrottle]

    def get(self, request):
        return Response({"orders": []})


class DualAPI(APIView):
    """Its URL is named like its throttle_scope: the middleware and DRF both see the scope."""

    throttle_scope = "drf-dual"
    throttle_classes = [RuleThrottle]

    def get(self, request):
        return Response({"dual": True})


class DefaultedAPI(APIView):
    """Throttled by the code default of @throttle("search", rate="3/m") in tests/views.py."""

    throttle_scope = "search"
    throttle_classes = [RuleThrottle]

    def get(self, request):
        return Response({"search": True})


class FreeAPI(APIView):
    """Throttled by nothing but what rules its path may have."""

    throttle_classes: list[type] = []

    def get(self, request):
        return Response({"free": True})


@method_decorator(throttle("drf-decorated", rate="5/m"), name="dispatch")
class DecoratedAPI(APIView):
    throttle_classes: list[type] = []

    def get(self, request, pk):
        return Response({"pk": pk})
