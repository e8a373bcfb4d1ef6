"""The example project. Importing the Celery app here makes it current when Django starts."""

from .celery import app as celery_app

__all__ = ["celery_app"]
