"""Is an owner known dead? Same host: by pid and process start time (pid reuse)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import psutil

from beat_claims.runs import Owner, process_is_gone


def test_a_running_process_is_not_gone() -> None:
    me = Owner.current()
    assert process_is_gone(me.host, me.pid, me.started_at) is False


def test_an_exited_process_is_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(proc.pid).create_time()
    proc.wait()
    assert process_is_gone(socket.gethostname(), proc.pid, started) is True


def test_a_reused_pid_means_the_owner_is_gone() -> None:
    # The recorded owner started long before the process that now has its pid.
    started = psutil.Process(os.getpid()).create_time()
    assert process_is_gone(socket.gethostname(), os.getpid(), started - 3600) is True


def test_another_host_cannot_be_judged_here() -> None:
    assert process_is_gone("some-other-host", os.getpid(), 0.0) is None
