"""Django integration: add ``"beat_claims.contrib.django"`` to ``INSTALLED_APPS``.

Its app config installs the worker side (outcomes and fencing) on the project's Celery app
when Django starts, and adds the ``beat_claims_status`` management command.
"""
