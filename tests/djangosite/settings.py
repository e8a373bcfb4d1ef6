"""Settings of the test Django site.

The database is the local PostgreSQL (``BC_DJANGO_DB=sqlite`` for SQLite); pytest-django
creates and drops its own test database. Real ``celery beat``/``worker`` subprocesses read
the same settings, with ``BC_DJANGO_DB_NAME`` naming the test database they must use.

Each test session's database is its own: ``test_beat_claims_<pid>``, to which pytest-django
adds the xdist worker's id (``_gw0``), so two suites on one machine (two worktrees, CI beside
a developer) never create, use or drop each other's. ``BC_DJANGO_TEST_DB`` names it instead.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "tests.djangosite.urls"
STATIC_URL = "static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_celery_results",
    "django_celery_beat",
    "beat_claims.contrib.django",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]

if os.environ.get("BC_DJANGO_DB") == "sqlite":
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("BC_DJANGO_DB_NAME", str(BASE_DIR / "test.sqlite3")),
    }}
else:
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("BC_DJANGO_DB_NAME", "beat_claims"),
        "USER": os.environ.get("BC_PGUSER", "postgres"),
        "HOST": os.environ.get("BC_PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("BC_PGPORT", "5432"),
        "TEST": {"NAME": os.environ.get("BC_DJANGO_TEST_DB",
                                        f"test_beat_claims_{os.getpid()}")},
    }}

# -- Celery, through the CELERY namespace -------------------------------------------------
# Tests point these at their private redis-server (BC_* in child processes, app.conf in
# this one). The defaults are a port nothing listens on, never the machine's shared Redis.
UNREACHABLE = "redis://127.0.0.1:1/15"
CELERY_BROKER_URL = os.environ.get("BC_BROKER_URL", UNREACHABLE)
CELERY_RESULT_BACKEND = "django-db"
CELERY_BEAT_CLAIMS_URL = os.environ.get("BC_REDIS_URL", UNREACHABLE)
CELERY_BEAT_CLAIMS_HEARTBEAT_INTERVAL = 1.0
CELERY_BEAT_MAX_LOOP_INTERVAL = 1
BEAT_CLAIMS_CELERY_APP = "tests.djangosite.celery:app"
if os.environ.get("BC_BEAT_SCHEDULER"):  # as the README's Django set-up names it
    CELERY_BEAT_SCHEDULER = os.environ["BC_BEAT_SCHEDULER"]
