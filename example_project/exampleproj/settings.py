"""Settings of the beat-claims example project (SQLite database, two beats welcome).

Two modes, chosen by ``BC_STORE`` (``run.sh`` sets it):

- ``redis`` (the default): the broker is the Redis at ``REDIS_URL`` (database 0 of
  127.0.0.1:6379 by default) and the beat-claims store is database 1 of the same server
  (``CLAIMS_URL``: a Redis of its own), its keys under ``example-claims``;
- ``sqlite``: nothing but Python. The store is the SQLite file ``claims.db`` and the broker
  is kombu's filesystem transport (one file a message), both under ``EXAMPLE_DATA``
  (default ``example_project/.data``). One host only.

Task results go to this project's database (django-celery-results) in both. The admin
(``/admin/``) shows what the beats claimed and sent, read from the store, under
"beat-claims > Entries"; django-celery-results' task results link from each run.
"""

import os
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from celery.schedules import crontab

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "example-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_results",
    "beat_claims.contrib.django",
    "reports",
]
if os.environ.get("EXAMPLE_NO_HOOKS") == "1":  # a fleet whose workers lack the hooks
    INSTALLED_APPS.remove("beat_claims.contrib.django")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
STATIC_URL = "static/"

ROOT_URLCONF = "exampleproj.urls"
WSGI_APPLICATION = "exampleproj.wsgi.application"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("EXAMPLE_DB", BASE_DIR / "db.sqlite3"),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

# -- Celery (read by exampleproj/celery.py with namespace="CELERY") -------------------------
#: The database of the broker's Redis that holds the beat-claims store (CLAIMS_URL: elsewhere).
CLAIMS_DB = 1


def in_database(url: str, db: int) -> str:
    """The Redis URL ``url`` with database ``db`` (a unix socket's ``?db=`` too)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "db"]
    if parts.scheme == "unix":
        return f"unix://{parts.netloc}{parts.path}?{urlencode([*query, ('db', str(db))])}"
    return urlunsplit(parts._replace(path=f"/{db}", query=urlencode(query)))


STORE = os.environ.get("BC_STORE", "redis")
if STORE == "sqlite":
    DATA_DIR = Path(os.environ.get("EXAMPLE_DATA", BASE_DIR / ".data")).resolve()
    BROKER_DIR = DATA_DIR / "broker"
    for folder in ("queue", "control"):  # the transport does not create them
        (BROKER_DIR / folder).mkdir(parents=True, exist_ok=True)
    # A message is a file in queue/, taken by renaming it away; the exchange bindings
    # (fanout too: remote control works) are files in control/. The transport is kombu's
    # with one fix (exampleproj/broker.py): a message file appears whole or not at all.
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT = "exampleproj.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "control_folder": str(BROKER_DIR / "control"),
    }
    CELERY_BEAT_CLAIMS_URL = f"sqlite:///{DATA_DIR / 'claims.db'}"
elif STORE == "redis":
    CELERY_BROKER_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    # The store in a database of its own: the broker's queue (and anything else in
    # REDIS_URL's database) never shares one with it, a FLUSHDB there never wipes it.
    CELERY_BEAT_CLAIMS_URL = os.environ.get("CLAIMS_URL") or in_database(
        CELERY_BROKER_URL, CLAIMS_DB)
else:
    raise ValueError(f"BC_STORE={STORE!r}: must be 'redis' or 'sqlite'")
CELERY_RESULT_BACKEND = "django-db"
CELERY_RESULT_EXTENDED = True  # task results record the entry name (periodic_task_name)
CELERY_BEAT_SCHEDULER = "beat_claims.Scheduler"

CELERY_BEAT_CLAIMS_HEARTBEAT_INTERVAL = float(os.environ.get("EXAMPLE_HEARTBEAT", "2"))
CELERY_BEAT_CLAIMS_RECLAIM_AFTER = 60
CELERY_BEAT_CLAIMS_KEY_PREFIX = "example-claims"

#: How long slow_report takes (EXAMPLE_SLOW_REPORT_SECONDS: the example's test makes it
#: short, as a worker's warm shutdown waits for it).
SLOW_REPORT_SECONDS = float(os.environ.get("EXAMPLE_SLOW_REPORT_SECONDS", "12"))

#: How often the heartbeat entry runs (EXAMPLE_HEARTBEAT_EVERY: the example's test makes it
#: shorter, as it waits for two of them).
HEARTBEAT_EVERY = float(os.environ.get("EXAMPLE_HEARTBEAT_EVERY", "5"))

CELERY_BEAT_SCHEDULE = {
    "heartbeat": {
        "task": "reports.tasks.heartbeat",
        "schedule": HEARTBEAT_EVERY,
    },
    "minutely-report": {
        "task": "reports.tasks.minutely_report",
        "schedule": crontab(),  # every minute
    },
    "slow-report": {
        "task": "reports.tasks.slow_report",
        "schedule": 10.0,
        # It takes 12 s, so every other occurrence finds the previous one running and is
        # recorded as skipped rather than sent.
        "kwargs": {"seconds": SLOW_REPORT_SECONDS},
        "claims": {"catch_up": "all", "overlap": "skip", "run_timeout": 600},
    },
}
