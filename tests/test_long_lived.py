"""The beat's long-lived objects are frozen once, when its schedule is first registered, so
that a full garbage collection in the middle of a burst walks only what came later."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from .conftest import RedisServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_garbage_is_collected_before_the_freeze_and_it_happens_once() -> None:
    out = run_python("""
        import gc, weakref
        from beat_claims.beat.long_lived import freeze_long_lived

        class Node: pass
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector can free it
        gone = weakref.ref(a)
        del a, b
        first = freeze_long_lived()
        frozen = gc.get_freeze_count()
        print(first, gone() is None, frozen > 0, freeze_long_lived(),
              gc.get_freeze_count() == frozen)
    """)
    assert out == "True True True False True"


def test_a_beat_freezes_what_it_has_once_its_schedule_is_registered(
        server: RedisServer) -> None:
    out = run_python(f"""
        import gc
        from tests.inprocess import make, make_app, settled

        class Server:  # the test's redis-server, as make_app reads it
            url = {server.url!r}
            def broker_url(self): return {server.broker_url()!r}

        app = make_app(Server())
        s = make(app, settle=False)
        built = gc.get_freeze_count()  # the schedule is set up, not registered yet
        settled(s)
        seen = [o for o in gc.get_objects() if o is s.schedule or o is s.claimer.states]
        print(built, gc.get_freeze_count() > 0, seen == [])
        s.close()
    """)
    # Nothing frozen when the scheduler is built; after the first registration the schedule
    # and the claimer's states are among the frozen objects (gc.get_objects() omits them).
    assert out == "0 True True"


def test_a_beat_ticked_in_a_thread_of_another_program_freezes_nothing() -> None:
    out = run_python("""
        import gc, threading
        from beat_claims.beat.long_lived import freeze_long_lived

        answers = []
        t = threading.Thread(target=lambda: answers.append(freeze_long_lived()))
        t.start(); t.join()
        print(answers, gc.get_freeze_count())
    """)
    assert out == "[False] 0"


def test_a_stop_signal_during_the_freeze_stops_the_beat(server: RedisServer) -> None:
    """Celery's stop handler raises SystemExit; raised inside a finalizer the collection
    runs, Python would print it and go on (the beat would ignore the signal)."""
    out = run_python(f"""
        import os, signal, time
        from beat_claims.beat import long_lived
        from tests.inprocess import make, make_app

        class Server:
            url = {server.url!r}
            def broker_url(self): return {server.broker_url()!r}

        def stop(signum, frame):
            raise SystemExit(3)

        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)  # lands in the finalizer

        real_collect = long_lived.gc.collect

        def collect(*args):
            Finalized()
            return real_collect(*args)

        long_lived.gc = type("gc", (), dict(collect=staticmethod(collect),
                                            freeze=staticmethod(long_lived.gc.freeze)))
        signal.signal(signal.SIGTERM, stop)
        s = make(make_app(Server()), settle=False)
        deadline = time.monotonic() + 30  # (the new store settles first)
        try:
            while time.monotonic() < deadline and not s._registered_once:
                time.sleep(min(s.tick(), 0.2))
            for _ in range(3):
                s.tick()
            print("went on", s._registered_once)
        except SystemExit as exc:
            print("stopped", exc.code)
    """)
    assert out == "stopped 3"
