"""A Django REST framework view throttled by RuleThrottle (DRF is optional)."""

from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.contrib.drf import RuleThrottle


class OrdersAPI(APIView):
    throttle_scope = "drf-orders"
    throttle_classes = [RuleThrottle]

    def get(self, request):
        return Response({"orders": []})
