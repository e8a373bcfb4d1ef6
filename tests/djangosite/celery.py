"""The test site's Celery app, configured from Django settings (``CELERY`` namespace)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.djangosite.settings")

app = Celery("djangosite")
app.config_from_object("django.conf:settings", namespace="CELERY")
