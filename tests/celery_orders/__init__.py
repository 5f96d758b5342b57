"""The Celery example of docs/usage.md ("Celery tasks"): tasks.py is the doc's code block."""
