"""Is an owner known dead? Same host: by pid and process identity (pid reuse)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from beat_claims.runs import Owner, process_identity, process_is_gone


def test_a_running_process_is_not_gone() -> None:
    me = Owner.current()
    assert process_is_gone(me.host, me.pid, me.process) is False


def test_an_exited_process_is_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        identity = process_identity(proc.pid)
        assert identity
    finally:
        proc.kill()
        proc.wait()
    assert process_is_gone(socket.gethostname(), proc.pid, identity) is True


def test_a_reused_pid_means_the_owner_is_gone() -> None:
    # The recorded owner had another identity than the process that now has its pid.
    mine = process_identity(os.getpid())
    assert mine
    assert process_is_gone(socket.gethostname(), os.getpid(), mine + "-older") is True


def test_another_host_cannot_be_judged_here() -> None:
    assert process_is_gone("some-other-host", os.getpid(), "x:1") is None


def test_an_unrecorded_identity_cannot_be_judged() -> None:
    assert process_is_gone(socket.gethostname(), os.getpid(), "") is None


def test_a_process_numbered_in_another_pid_namespace_or_boot_cannot_be_judged_here() -> None:
    """One hostname, two pid namespaces (containers) or two machines: a pid recorded there
    names another process here, or none (the end-to-end case:
    tests/test_worker_liveness.py, a worker in a pid namespace of its own)."""
    boot, namespace, ticks = (process_identity(os.getpid()) or "").split(":")
    host = socket.gethostname()
    assert process_is_gone(host, os.getpid(), f"{boot}:4026500000:{ticks}1") is None
    assert process_is_gone(host, 4_000_000, f"{boot}:4026500000:{ticks}") is None
    assert process_is_gone(host, 4_000_000, f"other-boot:{namespace}:{ticks}") is None
    assert process_is_gone(host, 4_000_000, f"{boot}:{namespace}:{ticks}") is True


def test_an_older_versions_identity_is_still_judged() -> None:
    """Recorded as ``boot:ticks`` by a version without the namespace: alive while it is
    that process, gone once its pid is another's."""
    boot, _, ticks = (process_identity(os.getpid()) or "").split(":")
    host = socket.gethostname()
    assert process_is_gone(host, os.getpid(), f"{boot}:{ticks}") is False
    assert process_is_gone(host, os.getpid(), f"{boot}:{ticks}1") is True
