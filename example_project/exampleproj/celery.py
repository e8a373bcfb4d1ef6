"""The Celery app, configured from Django settings (the ``CELERY_`` namespace)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "exampleproj.settings")

app = Celery("exampleproj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
