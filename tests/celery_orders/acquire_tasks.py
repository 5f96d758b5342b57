# orders/tasks.py: acquire() waits in the worker for a turn
from celery import shared_task

from django_throttle import acquire

from .partners import send_order


@shared_task(bind=True, max_retries=None)
def push_order(self, order_id, partner):
    decision = acquire("partner-api", f"partner:{partner}", timeout=2.0)
    if not decision.allowed:
        # No slot within 2 s: give the worker back and try later.
        raise self.retry(countdown=decision.retry_after)
    send_order(partner, order_id)
