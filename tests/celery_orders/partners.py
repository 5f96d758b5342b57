# orders/partners.py: the partner's API, posting an order as JSON
import json
from urllib.error import HTTPError
from urllib.request import Request, urlopen

from django.conf import settings


class PartnerBusy(Exception):
    """The partner answered 429 or 503: it asks us to come back later."""


def send_order(partner, order_id):
    request = Request(
        f"{settings.PARTNER_API_URL}/{partner}/orders/",
        data=json.dumps({"order": order_id}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urlopen(request, timeout=10):
            pass
    except HTTPError as error:
        if error.code in (429, 503):
            raise PartnerBusy(error.code) from error
        raise
