# orders/tasks.py
from celery import shared_task

from django_throttle.contrib.celery import throttle_task

from .partners import PartnerBusy, send_order


@shared_task(bind=True, max_retries=3)
@throttle_task("partner-api", key=lambda order_id, partner: f"partner:{partner}")
def push_order(self, order_id, partner):
    try:
        send_order(partner, order_id)
    except PartnerBusy as exc:
        # The partner's own errors still use the task's retries; waiting for a turn does not.
        raise self.retry(exc=exc, countdown=30) from exc
