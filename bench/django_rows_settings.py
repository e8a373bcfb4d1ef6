"""The test site's Django settings (``tests/djangosite``) with beat-claims' defaults for
the loop: a heartbeat every 5 s (a TTL of 15 s) and ``beat_max_loop_interval`` 5 s, as a
deployment of 100,000 rows runs (the test site's 1 s heartbeat is for fast tests)."""

from tests.djangosite.settings import *  # noqa: F403

CELERY_BEAT_CLAIMS_HEARTBEAT_INTERVAL = 5.0
CELERY_BEAT_MAX_LOOP_INTERVAL = 5
