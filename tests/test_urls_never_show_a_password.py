"""A store's password never appears where its URL is shown: ``redact_url`` on every URL
form docs/stores.md gives, with a password in every place it can be, and such URLs through
every place that shows one (configuration errors, real beats, workers and ``celery claims``
processes, Django's checks and admin, the exporter, the stores' own errors).

Every password here is ``Xq7<something>Zr9``: a place leaks when ``Xq7`` or ``Zr9`` (in any
case: hosts are lower-cased) appears in what it shows, whatever it did to the rest.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from .conftest import RedisServer, free_port, own_redis
from .processes import ROOT, Fleet, running, wait_for

PIECES = ("Xq7", "Zr9")
#: The characters a password may hold that a URL's syntax uses, alone and all at once.
SPECIALS = ("", "/", "@", "#", "?", ";", ":", "%", "%40", "%2F", "/@#?;%")
PASSWORDS = tuple(f"Xq7{c}Zr9" for c in SPECIALS)
#: The password of the servers the processes talk to: every special character, escaped in
#: URLs as clients need it.
PASSWORD = "Xq7/@#?;%:Zr9"
ESCAPED = quote(PASSWORD, safe="")


def leaks(text: str) -> list[str]:
    """The password's pieces found in ``text`` (any case)."""
    return [piece for piece in PIECES if piece.lower() in text.lower()]


#: A CSRF token in a page (a hidden field's value).
CSRF_TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="[^"]*"')


def assert_clean(text: str, where: str) -> None:
    found = leaks(text)
    assert not found, f"{where} shows {found} of the password:\n{text}"


# -- the one function ---------------------------------------------------------------------
#: The URL forms of docs/stores.md, ``{ui}`` the user-info, ``{q}`` a query.
FORMS = {
    "redis": ("redis://{ui}127.0.0.1:6379/0{q}", "127.0.0.1:6379/0"),
    "rediss": ("rediss://{ui}store.example:6380/0{q}", "store.example:6380/0"),
    "unix socket": ("unix://{ui}/run/redis/redis.sock?db=0{qa}", "/run/redis/redis.sock?db=0"),
    "sentinel": ("sentinel://{ui}s1:26379;sentinel://{ui}s2:26379;sentinel://s3:26379/0{q}",
                 "s3:26379/0"),
    "redis+cluster": ("redis+cluster://{ui}node1:7000{q}", "node1:7000"),
    "rediss+cluster": ("rediss+cluster://{ui}node1:7000{q}", "node1:7000"),
    "postgresql": ("postgresql://{ui}db.example:5432/app{q}", "db.example:5432/app"),
    "postgres": ("postgres://{ui}db.example:5432/app{q}", "db.example:5432/app"),
}
#: Where a password can be: (user-info, query).
PLACES = {
    "user and password": ("alice:{pw}@", ""),
    "password without user": (":{pw}@", ""),
    "lone password": ("{pw}@", ""),
    "query password": ("", "password={pw}"),
    "query sentinel_password": ("", "db=0&sentinel_password={pw}&ssl_cert_reqs=none"),
    "query %-escaped name": ("", "Pass%77ord={pw}&x=1"),
    "query PASSWORD": ("", "PASSWORD={pw}"),
    "query secret": ("", "client_secret={pw}"),
    "query token": ("", "auth_token={pw}"),
    "everywhere": ("alice:{pw}@", "password={pw}&sentinel_password={pw}"),
}


def url_of(form: str, place: str, password: str) -> str:
    template, _ = FORMS[form]
    userinfo, query = PLACES[place]
    query = query.format(pw=password)
    return template.format(ui=userinfo.format(pw=password), q=f"?{query}" if query else "",
                           qa=f"&{query}" if query else "")


@pytest.mark.parametrize("form", FORMS)
def test_every_documented_form_with_a_password_anywhere_is_masked(form: str) -> None:
    from beat_claims.urls import redact_url

    failures = []
    for place in PLACES:
        if place == "lone password" and form.startswith("postgres"):
            continue  # libpq reads it as the user (below)
        for password in PASSWORDS:
            if place == "lone password" and ":" in password:
                continue  # "Xq7:Zr9@": a user and a password, for every client
            url = url_of(form, place, password)
            shown = redact_url(url)
            if leaks(shown) or "***" not in shown:
                failures.append(f"{url}  ->  {shown}")
            elif password == "Xq7Zr9" and FORMS[form][1] not in shown:
                failures.append(f"{url}  ->  {shown} (the host is lost)")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
    ("rediss://user:pw@h:6380/0?ssl_cert_reqs=none",
     "rediss://user:***@h:6380/0?ssl_cert_reqs=none"),
    ("redis://user:p@ss@h/0", "redis://user:***@h/0"),
    ("redis://:p%40w@h", "redis://:***@h"),
    ("redis://:with/slash@h/0", "redis://:***@h/0"),
    ("redis://u:a#b@h:6379/0", "redis://u:***@h:6379/0"),
    ("redis://u:a?b@h/0?db=1", "redis://u:***@h/0?db=1"),
    # redis-cli and the Redis URI scheme read a lone user-info as the password; libpq as
    # the user.
    ("redis://pw@h/0", "redis://***@h/0"),
    ("postgresql://alice@h/app", "postgresql://alice@h/app"),
    ("unix://u:pw@/run/redis.sock?db=1", "unix://u:***@/run/redis.sock?db=1"),
    ("unix:///run/redis.sock?db=1&password=pw", "unix:///run/redis.sock?db=1&password=***"),
    ("redis://h/0?password=pw&db=1", "redis://h/0?password=***&db=1"),
    ("redis://h/0?password=a?b;c&db=1", "redis://h/0?password=***?***;***&db=1"),
    ("sentinel://u:pw@h1:26379;sentinel://:pw2@h2:26379/0",
     "sentinel://u:***@h1:26379;sentinel://:***@h2:26379/0"),
    ("sentinel://:p;w@h1;sentinel://h2/0?sentinel_password=x",
     "sentinel://:***@h1;sentinel://h2/0?sentinel_password=***"),
    ("redis+cluster://u:pw@n1:7000,n2:7001", "redis+cluster://u:***@n1:7000,n2:7001"),
    ("postgresql://u:pw@[::1]:5432,h2:5433/app?sslmode=require&sslpassword=k",
     "postgresql://u:***@[::1]:5432,h2:5433/app?sslmode=require&sslpassword=***"),
    ("postgresql:///app?host=/var/run/postgresql&password=pw",
     "postgresql:///app?host=/var/run/postgresql&password=***"),
    ("sqlite:////var/lib/claims@1.db", "sqlite:////var/lib/claims@1.db"),
    ("django", "django"),
    ("django:reporting", "django:reporting"),
    ("amqp://guest:guest@rabbit//", "amqp://guest:***@rabbit//"),
    # libpq key=value strings (a DSN given where a URL was expected)
    ("host=h password=pw dbname=app", "host=h password=*** dbname=app"),
    ("host=h password='p w\\'x' dbname=app", "host=h password=*** dbname=app"),
    ("", ""),
    ("not a url", "not a url"),
])
def test_the_shape_of_what_is_shown(url: str, shown: str) -> None:
    from beat_claims.urls import redact_url

    assert redact_url(url) == shown


@pytest.mark.parametrize("url", [
    "host=db password=Xq7Zr9 user=alice",
    "host=db password = 'Xq7 Zr9' user=alice",
    "host=db password='Xq7\\'Zr9' user=alice",
    "host=db password='Xq7 Zr9",  # unterminated
    "host=db password=Xq7 Zr9 user=alice",  # (libpq: a syntax error; shown masked)
    "dbname=app sslpassword=Xq7Zr9",
    # Not URLs as written: masked more, never less
    "redis:/alice:Xq7Zr9@h/0",
    "redis//alice:Xq7Zr9@h/0",
    "redis://alice:Xq7Zr9",
    "redis://alice:Xq7/Zr9",
    "redis://alice:Xq7#Zr9",
    "redis://[alice:Xq7Zr9@h",
    "redis://h/0?password=Xq7#Zr9",
    "redis://h:6379/0?password=Xq7@Zr9",
    "postgresql://u@h/db?password=Xq7@Zr9",
    "postgresql://h/db?sslrootcert=/a@b&password=Xq7Zr9",
    " redis://:Xq7Zr9@h",
    "django:alice:Xq7Zr9@x",
    "redis://h/0;password=Xq7Zr9",
    "redis://h/0?a=" + "@Xq7Zr9" * 40,  # (more @ than readings: masked whole)
])
def test_unparseable_urls_and_libpq_strings_are_masked(url: str) -> None:
    from beat_claims.urls import redact_url

    shown = redact_url(url)
    assert not leaks(shown) and "***" in shown, f"{url} -> {shown}"


def test_it_never_raises() -> None:
    from beat_claims.urls import redact_text, redact_url

    rng = random.Random(7)
    alphabet = "redis:/@?#;%&=:[]_ ,'\\\"\n\x00é.Xq7Zr9"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))
        assert isinstance(redact_url(text), str)
        assert isinstance(redact_text(text, text), str)
    for odd in (None, b"redis://:Xq7Zr9@h", 42):
        shown = redact_url(odd)  # type: ignore[arg-type]
        assert isinstance(shown, str) and not leaks(shown)


# -- errors the clients make of a URL they misread ------------------------------------------
def _open_error(url: str, **conf: Any) -> str:
    from beat_claims.settings import Settings
    from beat_claims.stores import StoreConfigurationError, open_store

    with pytest.raises(StoreConfigurationError) as refused:
        open_store(Settings(url=url, **conf), timeout=1.0)
    return str(refused.value)


@pytest.mark.parametrize("url", [
    "redis://alice:Xq7/Zr9@127.0.0.1:6379/0",  # redis-py: port "Xq7"
    "redis://:Xq7#Zr9@127.0.0.1:6379/0",
    "rediss+cluster://alice:Xq7?Zr9@127.0.0.1:7000",
    "redis+cluster://alice:Xq7Zr9@n1:7000/3?password=Xq7Zr9",  # database 3: refused
    "postgresql://alice:p%zzXq7Zr9@127.0.0.1/app",  # libpq quotes the bad escape
    "postgresql://alice:Xq7Zr9@[::1/app",  # libpq quotes the whole URL
    "postgresql://alice@127.0.0.1/app?bogus=1&password=Xq7Zr9",
    "sqlite:///claims.db?password=Xq7Zr9",
    "mongodb://alice:Xq7Zr9@db/app?password=Xq7Zr9",  # unknown store
    "mysql://alice:Xq7Zr9@db/app?password=Xq7Zr9",  # an option the store does not take
    "mariadb://alice:Xq7/Zr9@db:3306/app",  # a port misread from the password
    "mysql://alice:Xq7Zr9@127.0.0.1:3306",  # no database
    "mysql://alice:Xq7\uff03Zr9@db/app",  # urlsplit quotes the netloc (NFKC: a "#")
    "mysql://alice:Xq7Zr9@db/app?connect_timeout=soon",  # not a number
])
def test_a_url_a_client_misreads_is_refused_without_its_password(url: str) -> None:
    message = _open_error(url)
    assert "beat_claims_url" in message
    assert_clean(message, "the configuration error")


def test_sentinel_urls_with_passwords_are_refused_without_them() -> None:
    from beat_claims.settings import ConfigurationError, Settings

    url = ("sentinel://alice:Xq7/Zr9@s1:26379;sentinel://:Xq7Zr9@s2:26379/0"
           "?sentinel_password=Xq7Zr9")
    message = _open_error(url, sentinel_master="mymaster")  # (no query options)
    assert "sentinel" in message
    assert_clean(message, "the Sentinel error")
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_app(_app(beat_claims_url=url))  # no master's name
    assert "beat_claims_sentinel_master" in str(refused.value)
    assert_clean(str(refused.value), "the Sentinel error")


def test_a_broker_that_is_not_redis_is_named_without_its_password() -> None:
    from beat_claims.settings import ConfigurationError, Settings

    with pytest.raises(ConfigurationError) as refused:
        Settings.from_app(_app(broker_url="amqp://guest:Xq7Zr9@rabbit//?password=Xq7Zr9"))
    assert "amqp://guest:***@rabbit//" in str(refused.value)
    assert_clean(str(refused.value), "the broker error")


def _app(**conf: Any) -> Any:
    from celery import Celery

    app = Celery("urls", set_as_current=False)
    app.conf.update(conf)
    return app


@pytest.mark.parametrize(("url", "said"), [
    # redis-py takes "xq7" as the host (the user-info ends at the "/") and cannot resolve it
    ("redis://Xq7/Zr9@127.0.0.1:6379/0", "cannot be resolved"),
    # libpq takes 127.0.0.1 (the user) as the host and "Xq7" as the port
    ("postgresql://127.0.0.1:Xq7/Zr9@db.example/app",
     'invalid integer value "***" for connection option "port"'),
])
def test_what_a_client_misread_of_the_password_is_not_echoed(url: str, said: str) -> None:
    """The client's error quotes a piece of the password: the store's error masks it, and
    is not chained to the client's (a traceback would show it)."""
    from beat_claims.settings import Settings
    from beat_claims.stores import StoreConfigurationError, StoreError, open_store

    store = open_store(Settings(url=url), timeout=1.0)
    assert_clean(store.description, "the description")
    with pytest.raises((StoreError, StoreConfigurationError)) as failed:
        store.owners()
    assert said in str(failed.value)
    assert_clean(str(failed.value), "the store's error")
    assert failed.value.__cause__ is None and failed.value.__suppress_context__


@pytest.mark.parametrize("url", [
    "redis://alice:Xq7Zr9@127.0.0.1:{port}/0?password=Xq7Zr9",
    "postgresql://alice:Xq7Zr9@127.0.0.1:{port}/app?sslpassword=Xq7Zr9",
])
def test_an_unreachable_store_is_named_without_its_password(url: str) -> None:
    from beat_claims.settings import Settings
    from beat_claims.stores import StoreError, open_store

    store = open_store(Settings(url=url.format(port=free_port())), timeout=1.0)
    assert_clean(store.description, "the description")
    with pytest.raises(StoreError) as down:
        store.owners()
    assert_clean(str(down.value), "the outage")


def test_a_django_database_is_described_without_its_password() -> None:
    import warnings

    from django.test import override_settings

    from beat_claims.stores.postgres import PostgresStore

    database = {"ENGINE": "django.db.backends.postgresql", "NAME": "app", "USER": "alice",
                "PASSWORD": PASSWORD, "HOST": "db.example", "PORT": "5432",
                "OPTIONS": {"sslpassword": "Xq7Zr9", "sslmode": "prefer"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with override_settings(DATABASES={"default": database, "other": database}):
            for url in ("django", "django:other"):
                description = PostgresStore.from_url(url).description
                assert description.startswith(f"{url} (") and "host=db.example" in description
                assert_clean(description, "the description")


# -- real processes -----------------------------------------------------------------------
@pytest.fixture
def guarded() -> Iterator[RedisServer]:
    """A redis-server whose ACL user ``alice`` has the password ``PASSWORD``."""
    with own_redis(["--user", "alice", "on", f">{PASSWORD}", "~*", "&*", "+@all"]) as server:
        yield server


def guarded_url(server: RedisServer, password: str = ESCAPED) -> str:
    """Its URL with the password in the user-info and in the query, under a %-escaped name
    (redis-py reads ``pass%77ord`` as ``password``)."""
    return f"redis://alice:{password}@127.0.0.1:{server.port}/0?pass%77ord={password}"


def run(server: RedisServer, store_url: str, *args: str, **conf: Any) -> tuple[int, str]:
    """``celery -A tests.proj.app ARGS`` to its end, the store at ``store_url``: (exit code,
    stdout + stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.proj.app", *args], cwd=ROOT,
        env=_env(server, store_url, **conf), capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def run_each(server: RedisServer, store_url: str, commands: list[list[str]],
             **conf: Any) -> list[tuple[int, str]]:
    """What :func:`run` gives for each of ``commands``, the processes run side by side
    (each command's output does not depend on another's)."""
    env = _env(server, store_url, **conf)
    with contextlib.ExitStack() as stack:
        files = [(stack.enter_context(tempfile.TemporaryFile()),
                  stack.enter_context(tempfile.TemporaryFile())) for _ in commands]
        procs = [subprocess.Popen([sys.executable, "-m", "celery", "-A", "tests.proj.app",
                                   *args], cwd=ROOT, env=env, stdout=out, stderr=err)
                 for args, (out, err) in zip(commands, files)]
        try:
            codes = [proc.wait(60) for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        done = []
        for code, (out, err) in zip(codes, files):
            out.seek(0)
            err.seek(0)
            done.append((code, (out.read() + err.read()).decode(errors="replace")))
        return done


def _env(server: RedisServer, store_url: str, **conf: Any) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "BC_REDIS_URL": server.url,
            "BC_BROKER_URL": server.broker_url(), "BC_SCHEDULE": json.dumps(
                {"tick": {"every": 1}}),
            "BC_CONF": json.dumps({"beat_claims_url": store_url, **conf})}


#: A Sentinel URL with a password in every place it can be.
SENTINEL = ("sentinel://alice:Xq7%2FZr9@127.0.0.1:{p1};sentinel://:Xq7Zr9@127.0.0.1:{p2}/0"
            "?sentinel_password=Xq7Zr9")


@pytest.mark.integration
@pytest.mark.parametrize(("what", "url", "conf", "expected"), [
    ("a Sentinel URL without a master's name", SENTINEL, {}, "beat_claims_sentinel_master"),
    ("a Sentinel URL with options", SENTINEL, {"beat_claims_sentinel_master": "m"},
     "take no query options"),
    ("an unknown scheme", "mongodb://alice:Xq7Zr9@db/app?password=Xq7Zr9", {},
     "unknown store"),
    ("a port misread from the password", "redis://alice:Xq7/Zr9@127.0.0.1:1/0", {},
     "beat_claims_url"),
])
def test_beat_worker_and_cli_refuse_a_bad_url_without_its_password(
        server: RedisServer, what: str, url: str, conf: dict[str, Any], expected: str) -> None:
    url = url.format(p1=free_port(), p2=free_port())
    commands = [["beat", "-S", "claims", "--loglevel", "INFO", "-s", os.devnull],
                ["worker", "--loglevel", "INFO", "-P", "solo", "--without-gossip",
                 "--without-mingle"],
                ["claims", "status"], ["claims", "health", "-j"]]
    for args, (code, out) in zip(commands, run_each(server, url, commands, **conf)):
        assert code == 1 and expected in out, (what, args, out)
        assert_clean(out, f"{args[0]} ({what})")


@pytest.mark.integration
def test_a_beat_and_a_worker_never_show_the_password(
        server: RedisServer, guarded: RedisServer, tmp_path: Path) -> None:
    """The beat's banner and start line, the worker's ready line, the outage both log
    when the store stops: the store named, its password nowhere."""
    url = guarded_url(guarded)
    env = {"BC_CONF": json.dumps({"beat_claims_url": url})}
    with running(Fleet(server.url, server.broker_url(), tmp_path, {"tick": {"every": 1}},
                       **env)) as fleet:
        beat = fleet.beat()
        worker = fleet.worker(concurrency=1)
        fleet.wait_log(beat, "Sending due task tick")
        fleet.wait_log(worker, "fencing")
        guarded.stop()
        fleet.wait_log(beat, "store unreachable")
        shown = f"redis://alice:***@127.0.0.1:{guarded.port}/0?pass%77ord=***"
        for name, proc in (("beat", beat), ("worker", worker)):
            assert shown in fleet.log(proc), fleet.log(proc)
            assert_clean(fleet.log(proc), f"the {name}'s log")
        # Celery's banner: the scheduler's info under ". scheduler ->"
        assert f"beat_claims.scheduler.Scheduler\n{shown} (prefix" in fleet.log(beat)


@pytest.mark.integration
def test_a_worker_refused_by_the_store_does_not_show_the_password(
        server: RedisServer, guarded: RedisServer, tmp_path: Path) -> None:
    url = guarded_url(guarded, password="Xq7%3FwrongZr9")
    env = {"BC_CONF": json.dumps({"beat_claims_url": url})}
    with running(Fleet(server.url, server.broker_url(), tmp_path, {}, **env)) as fleet:
        worker = fleet.worker(concurrency=1)
        fleet.wait_log(worker, "refused the credentials")
        assert_clean(fleet.log(worker), "the worker's log")


@pytest.mark.integration
def test_celery_claims_never_shows_the_password(server: RedisServer,
                                                guarded: RedisServer) -> None:
    url = guarded_url(guarded)
    up = [["status"], ["status", "-j"], ["health"], ["health", "-j"], ["health", "--beat"],
          ["history", "tick"], ["prune", "--dry-run", "-j"]]
    for args, (_code, out) in zip(up, run_each(server, url, [["claims", *a] for a in up])):
        assert "Traceback" not in out, (args, out)
        assert_clean(out, f"celery claims {' '.join(args)}")
    guarded.stop()
    down = [["status"], ["health"], ["health", "-j"], ["health", "--beat", "-j"]]
    for args, (code, out) in zip(down, run_each(server, url,
                                                [["claims", *a] for a in down])):
        assert code == 1 and "127.0.0.1" in out, (args, out)
        assert_clean(out, f"celery claims {' '.join(args)} (store down)")


@pytest.mark.integration
def test_celerys_report_and_a_workers_conf_never_show_the_password(
        server: RedisServer, guarded: RedisServer, tmp_path: Path) -> None:
    """Celery prints an app's settings, masking those whose name says a secret (and the
    broker's and backends' URLs): ``celery report``, and ``celery inspect conf``, which
    sends a worker's settings to whoever asks over the broker (Flower shows them).
    ``beat_claims_url`` is masked there too."""
    url = guarded_url(guarded)
    code, out = run(server, url, "report")
    assert code == 0 and "beat_claims_url" in out, out
    assert_clean(out, "celery report")
    env = {"BC_CONF": json.dumps({"beat_claims_url": url})}
    with running(Fleet(server.url, server.broker_url(), tmp_path, {}, **env)) as fleet:
        worker = fleet.worker(concurrency=1, pool="solo")
        fleet.wait_log(worker, "ready.", 60)
        # Asked of the worker by its name: the answer comes as soon as it replies, not
        # after the whole timeout spent waiting for any other worker's.
        code, out = run(server, url, "inspect", "conf", "-j", "--timeout", "10",
                        "-d", f"w0@{socket.gethostname()}")
        assert code == 0 and "beat_claims_url" in out, out
        assert_clean(out, "celery inspect conf")


@pytest.mark.integration
def test_the_exporter_never_shows_the_password(server: RedisServer,
                                               guarded: RedisServer) -> None:
    url = guarded_url(guarded)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.proj.app", "claims", "exporter",
         "--port", str(port), "--addr", "127.0.0.1", "--cache", "0"], cwd=ROOT,
        env=_env(server, url), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        scraped = []

        def scrape() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    scraped.append(r.read().decode())
                return True
            except OSError:
                return False

        wait_for(scrape, 30, "the exporter to serve /metrics")
        assert "beat_claims_fleet_up 1.0" in scraped[-1], scraped[-1]
        guarded.stop()
        wait_for(scrape, 10, "a scrape with the store down")
        assert "beat_claims_fleet_up 0.0" in scraped[-1], scraped[-1]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=20)[0].decode()
    assert "serving http://" in out and "redis://alice:***@127.0.0.1" in out, out
    for text in [out, *scraped]:
        assert_clean(text, "the exporter")


# -- Django ---------------------------------------------------------------------------------
def _checks(server: RedisServer, **conf: Any) -> list[tuple[str, str]]:
    from django.core.checks import run_checks

    from .djangosite.testing import configured, site_app

    with site_app(server.url, server.broker_url()) as app, configured(app, **conf):
        return [(m.id or "", f"{m.msg} {m.hint or ''}") for m in
                run_checks(tags=["beat_claims"])]


@pytest.mark.parametrize(("url", "conf"), [
    ("redis://alice:Xq7%2FZr9@127.0.0.1:{port}/0?password=Xq7Zr9", {}),
    ("redis://Xq7Zr9@127.0.0.1:{port}/0", {}),
    (SENTINEL, {"beat_claims_sentinel_master": "m"}),  # (refused: a query) E002
    (SENTINEL.split("?")[0], {"beat_claims_sentinel_master": "m"}),
    ("redis+cluster://alice:Xq7Zr9@127.0.0.1:{port}", {}),
    ("postgresql://alice:Xq7Zr9@127.0.0.1:{port}/app?sslpassword=Xq7Zr9", {}),
])
def test_django_checks_never_show_the_password(server: RedisServer, url: str,
                                               conf: dict[str, Any]) -> None:
    port = free_port()
    url = url.format(port=port, p1=port, p2=free_port())
    found = _checks(server, beat_claims_url=url, **conf)
    assert [i for i, _ in found] in (["beat_claims.W001"], ["beat_claims.E002"]), found
    for check_id, message in found:
        assert "127.0.0.1" in message, message
        assert_clean(message, check_id)


def test_django_checks_name_a_broker_and_a_sentinel_url_without_the_password(
        server: RedisServer) -> None:
    found = _checks(server, beat_claims_url=None,
                    broker_url="amqp://guest:Xq7Zr9@rabbit//?password=Xq7Zr9")
    assert [i for i, _ in found] == ["beat_claims.E001"]
    found += _checks(server, beat_claims_url=SENTINEL.format(p1=1, p2=2))
    assert [i for i, _ in found] == ["beat_claims.E001", "beat_claims.E002"]
    for check_id, message in found:
        assert_clean(message, check_id)


@pytest.mark.django_db
def test_the_admin_never_shows_the_password(client: Any, server: RedisServer,
                                            guarded: RedisServer) -> None:
    from django.urls import reverse

    from .djangosite.testing import configured, site_app, staff

    client.force_login(staff("op", "view_entry"))

    def page(url: str) -> str:
        """The entries page and an entry's page."""
        html = []
        with site_app(server.url, server.broker_url(), beat_schedule={}) as app, \
                configured(app, beat_claims_url=url):
            for view, args in (("changelist", ()), ("change", ("tick",))):
                response = client.get(reverse(f"admin:beat_claims_entry_{view}", args=args))
                assert response.status_code == 200
                # (Django's CSRF token is random: a fragment of the password in it is
                # chance, 1 page in a few hundred, not a leak)
                html.append(CSRF_TOKEN.sub("csrf", response.content.decode()))
        return "\n".join(html)

    html = page(guarded_url(guarded))  # the store answers
    assert html.count("Store: <code>redis://alice:***@127.0.0.1") == 2
    assert "Cannot read" not in html
    assert_clean(html, "the entries page")
    html = page(guarded_url(guarded, password="wrong%3FXq7Zr9"))  # credentials refused
    assert "Cannot read the beat-claims store" in html
    assert_clean(html, "the entries page")
    html = page(SENTINEL.format(p1=1, p2=2))  # misconfigured
    assert "misconfigured" in html
    assert_clean(html, "the entries page")

