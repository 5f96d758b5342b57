"""The Celery examples of docs/usage.md: partners.py, tasks.py ("Celery tasks") and
acquire_tasks.py ("Limits without a request") are the docs' code blocks."""
