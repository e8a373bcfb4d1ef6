"""Django integration: add ``"beat_claims.contrib.django"`` to ``INSTALLED_APPS``.

Settings are read through Celery's ``CELERY`` namespace (``CELERY_BEAT_CLAIMS_URL``, ...).
The app config installs the worker side (outcomes and fencing) on the project's Celery app
when Django starts and registers system checks (``beat_claims.E001``...); the admin shows
entries, claims and runs from the store, and ``manage.py beat_claims status|history``
prints what ``celery claims`` prints.
"""
