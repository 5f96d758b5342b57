# chat/tasks.py: the completion made in a Celery task, charged to its user afterwards
from celery import shared_task

from django_throttle import charge_key

from . import llm


@shared_task
def summarize(user_id, text):
    result = llm.complete(f"Summarize: {text}")
    charge_key("/chat/", f"user:{user_id}", result.usage.total_tokens)
    return result.text
