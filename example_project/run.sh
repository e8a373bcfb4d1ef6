#!/usr/bin/env bash
# Run the example: one worker and two beats sharing one schedule, and the Django admin
# (runserver) that shows what they claimed and sent; then show what ran.
#
#   ./run.sh                      # venv in .venv; Redis if one answers, else SQLite (below)
#   REDIS_URL=redis://host:6379/3 ./run.sh   # the broker; the store is database 1 there
#   CLAIMS_URL=redis://host:6379/5 ./run.sh  # the store somewhere else
#   BC_STORE=sqlite ./run.sh      # no Redis even if one answers (BC_STORE=redis: Redis or fail)
#   BC_NO_VENV=1 ./run.sh         # use the current python instead of .venv
#   RUN_SECONDS=60 ./run.sh       # run longer than the default 20 s
#   RUN_SECONDS=0 ./run.sh        # run until Ctrl-C (to browse the admin)
#   ADMIN_ADDR=0.0.0.0:8080 ./run.sh   # where runserver listens (default 127.0.0.1:8000)
#   EXAMPLE_DATA=/some/dir ./run.sh    # where the SQLite mode keeps its files (default .data)
#
# The admin user is created from DJANGO_SUPERUSER_USERNAME and DJANGO_SUPERUSER_PASSWORD
# (Django's createsuperuser reads them) when both are set and the user does not exist yet.
#
# Which store and broker (BC_STORE unset or "auto"): Redis at REDIS_URL when it answers;
# else a throwaway redis-server on port 6399 (no persistence) when one runs there or the
# binary is installed. With Redis, the broker's queue is in REDIS_URL's database (0 by
# default) and the beat-claims store in database 1 of the same server, its keys under
# "example-claims" (CLAIMS_URL puts it elsewhere; exampleproj/settings.py). Else nothing
# but Python: the beat-claims store is the SQLite file $EXAMPLE_DATA/claims.db and the
# broker is kombu's filesystem transport, one file a message in $EXAMPLE_DATA/broker/.
# Task results go to the project's SQLite database (django-celery-results) in both modes.
#
# Why kombu's filesystem transport rather than its SQLAlchemy one (sqla+sqlite://): it needs
# no package beyond kombu; publishing takes no lock shared with the other processes (a beat
# writes its own file, the worker takes one by renaming it away); a consumed message is
# deleted. The SQLAlchemy transport needs SQLAlchemy, puts every publish and every poll of
# the worker behind the one write lock of the file, keeps consumed rows forever, and
# creates its tables and queue rows unguarded between processes: three processes started
# together on a fresh file, 20 times, failed 8 times in 60 ("table kombu_queue already
# exists", "UNIQUE constraint failed: kombu_queue.name"; kombu 5.7, SQLAlchemy 2.1). The
# filesystem transport has one race, fixed in exampleproj/broker.py: kombu creates a
# message file, then writes it, and a worker that takes the file in between stops
# ("Unrecoverable error: JSONDecodeError") and the message is lost (2 messages in 6000,
# two publishers and a busy consumer); the fix writes the file under another name and
# renames it into place (0 in 6000). Both are for one host (local files, local locks), as
# the SQLite store is.
#
# Everything started here is stopped on exit.
set -euo pipefail
set -m  # each background job in its own process group, so the cleanup can reach children

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"

RUN_SECONDS="${RUN_SECONDS:-20}"
LOG_DIR="${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/beat-claims-example.XXXXXX")}"
mkdir -p "$LOG_DIR"
PIDS=()          # celery processes
SERVICE_PIDS=()  # a redis-server started here

log() { printf '==> %s\n' "$*"; }

# -- python ---------------------------------------------------------------------------
if [ "${BC_NO_VENV:-0}" = "1" ]; then
    PY="$(command -v python3 || command -v python)"
    if ! "$PY" -c "import beat_claims, django, django_celery_results, kombu.transport.redis" \
            2>/dev/null; then
        log "installing requirements.txt (beat-claims[django]) into $PY"
        "$PY" -m pip install -q -r requirements.txt
    fi
else
    if [ ! -x .venv/bin/python ]; then
        log "creating .venv"
        if ! "$(command -v python3 || command -v python)" -m venv .venv; then
            rm -rf .venv
            echo "could not create .venv (on Debian and Ubuntu: apt-get install python3-venv)," >&2
            echo "or run with BC_NO_VENV=1 to install into the current python" >&2
            exit 1
        fi
    fi
    PY="$HERE/.venv/bin/python"
    log "installing requirements.txt (beat-claims[django]) into .venv"
    "$PY" -m pip install -q -r requirements.txt
fi
BIN="$(dirname "$PY")"
CELERY=("$PY" -m celery -A exampleproj)
[ -x "$BIN/celery" ] && CELERY=("$BIN/celery" -A exampleproj)

# -- cleanup: SIGTERM everything we started, then force what is left ----------------------
stop_group() {  # stop_group PID...: SIGTERM, wait for a warm shutdown, then SIGKILL
    local pid alive
    [ "$#" -eq 0 ] && return 0
    for pid in "$@"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    # A warm worker shutdown waits for running tasks (slow_report takes 12 s).
    for _ in $(seq 1 60); do
        alive=0
        for pid in "$@"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        [ "$alive" = 0 ] && break
        sleep 0.5
    done
    for pid in "$@"; do
        if kill -0 -- "-$pid" 2>/dev/null; then
            echo "    pid $pid (or its children) did not stop; killing its process group" >&2
            kill -KILL -- "-$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
}
stop_all() {
    if [ -n "${SLEEP_PID:-}" ]; then kill "$SLEEP_PID" 2>/dev/null || true; fi
    # Celery first, Redis last: the worker records outcomes while it shuts down.
    stop_group ${PIDS[@]+"${PIDS[@]}"}
    PIDS=()
    stop_group ${SERVICE_PIDS[@]+"${SERVICE_PIDS[@]}"}
    SERVICE_PIDS=()
}
trap 'stop_all' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start() {  # start NAME CMD...: run in the background, log to $LOG_DIR/NAME.log
    local name="$1"
    shift
    "$@" >"$LOG_DIR/$name.log" 2>&1 &
    PIDS+=("$!")
    log "started $name (pid $!), log: $LOG_DIR/$name.log"
}

# -- store and broker: redis or sqlite ---------------------------------------------------
redis_ok() {
    "$PY" - "$1" <<'PYEOF' >/dev/null 2>&1
import sys, redis
redis.Redis.from_url(sys.argv[1], socket_connect_timeout=1, socket_timeout=1).ping()
PYEOF
}

start_redis() {  # start_redis: Redis at $REDIS_URL, on port 6399, or started there; or fail
    FALLBACK="redis://127.0.0.1:6399/0"
    if redis_ok "$REDIS_URL"; then
        return 0
    elif redis_ok "$FALLBACK"; then
        log "Redis not reachable at $REDIS_URL; using the one already on port 6399"
    elif command -v redis-server >/dev/null 2>&1; then
        log "Redis not reachable at $REDIS_URL; starting redis-server on port 6399"
        redis-server --port 6399 --bind 127.0.0.1 --save "" --appendonly no \
            >"$LOG_DIR/redis.log" 2>&1 &
        SERVICE_PIDS+=("$!")
        for _ in $(seq 1 50); do redis_ok "$FALLBACK" && break; sleep 0.1; done
        redis_ok "$FALLBACK" || { echo "redis-server did not start" >&2; exit 1; }
    else
        return 1
    fi
    export REDIS_URL="$FALLBACK"
}

export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
BC_STORE="${BC_STORE:-auto}"
case "$BC_STORE" in
    redis)
        if ! start_redis; then
            echo "Redis is not reachable at $REDIS_URL and redis-server is not installed." >&2
            echo "Start Redis, set REDIS_URL, or run with BC_STORE=sqlite." >&2
            exit 1
        fi ;;
    auto)
        if start_redis; then
            BC_STORE=redis
        else
            log "no Redis at $REDIS_URL and redis-server is not installed: using SQLite"
            BC_STORE=sqlite
        fi ;;
    sqlite) ;;
    *)
        echo "BC_STORE=$BC_STORE: must be redis, sqlite or auto" >&2
        exit 2 ;;
esac
export BC_STORE
if [ "$BC_STORE" = redis ]; then
    log "Redis: broker $REDIS_URL, beat-claims store $("$PY" -c \
        'from exampleproj.settings import CELERY_BEAT_CLAIMS_URL as u; print(u)')"
else
    export EXAMPLE_DATA="${EXAMPLE_DATA:-$HERE/.data}"
    mkdir -p "$EXAMPLE_DATA"
    EXAMPLE_DATA="$(cd "$EXAMPLE_DATA" && pwd)"
    log "SQLite: store sqlite:///$EXAMPLE_DATA/claims.db; broker: kombu's filesystem" \
        "transport in $EXAMPLE_DATA/broker/"
fi

# -- django ---------------------------------------------------------------------------
export DJANGO_SETTINGS_MODULE=exampleproj.settings
"$PY" manage.py migrate --noinput -v 0
log "database migrated"
if [ "$BC_STORE" = sqlite ]; then
    # The task queue's binding, declared before the processes start: kombu's filesystem
    # transport creates a bindings file empty before it writes it, and another process
    # reading it in between would fail. Once it exists it is only ever rewritten in place.
    "$PY" - <<'PYEOF'
from exampleproj.celery import app

with app.connection_for_write() as conn:
    for queue in app.amqp.queues.values():
        queue(conn.default_channel).declare()
PYEOF
    log "broker queues declared"
fi
if [ -n "${DJANGO_SUPERUSER_USERNAME:-}" ] && [ -n "${DJANGO_SUPERUSER_PASSWORD:-}" ]; then
    if "$PY" manage.py createsuperuser --noinput --email "${DJANGO_SUPERUSER_EMAIL:-admin@example.com}" \
            >/dev/null 2>&1; then
        log "admin user '$DJANGO_SUPERUSER_USERNAME' created"
    else
        log "admin user '$DJANGO_SUPERUSER_USERNAME' already exists (or could not be created)"
    fi
else
    log "no admin user created: set DJANGO_SUPERUSER_USERNAME and DJANGO_SUPERUSER_PASSWORD,"
    log "or run: (cd example_project && python manage.py createsuperuser)"
fi

# -- one worker, two beats ------------------------------------------------------------
start worker "${CELERY[@]}" worker -l info -c 4 -n "example-worker@%h"
start beat1 "${CELERY[@]}" beat -S claims -l info
start beat2 "${CELERY[@]}" beat -S claims -l info
ADMIN_ADDR="${ADMIN_ADDR:-127.0.0.1:8000}"
start web "$PY" manage.py runserver --noreload "$ADMIN_ADDR"
log "admin: http://$ADMIN_ADDR/admin/beat_claims/entry/"

if [ "$RUN_SECONDS" = "0" ]; then
    log "running until Ctrl-C"
    SLEEP_ARG=infinity
else
    log "running for ${RUN_SECONDS}s"
    SLEEP_ARG="$RUN_SECONDS"
fi
# In the background and waited for, so that SIGTERM stops everything at once; Ctrl-C ends
# the wait and goes on to the status below.
sleep "$SLEEP_ARG" &
SLEEP_PID=$!
trap 'kill "$SLEEP_PID" 2>/dev/null || true' INT
wait "$SLEEP_PID" || true
trap 'exit 130' INT

log "celery -A exampleproj claims status"
"${CELERY[@]}" claims status || true

log "stopping (SIGTERM)"
stop_all

log "worker log: tasks that ran"
for task in heartbeat minutely_report slow_report; do
    printf '    %-16s %s\n' "$task" "$(grep -c "reports.tasks.$task\[.*\] succeeded" \
        "$LOG_DIR/worker.log" || true)"
done
printf '    %-16s %s\n' "refused" "$(grep -c "refusing delivery" "$LOG_DIR/worker.log" || true)"
for beat in beat1 beat2; do
    printf '    %-16s %s sent\n' "$beat" "$(grep -c "Sending due task" "$LOG_DIR/$beat.log" || true)"
done
log "logs kept in $LOG_DIR"
exit 0
