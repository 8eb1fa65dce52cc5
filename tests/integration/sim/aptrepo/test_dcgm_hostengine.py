"""The stand-in nv-hostengine of DCGM's package (sim/aptrepo/catalog.py), run as its unit runs it: while it
lives, the stub dcgmi reaches a host engine; once it is stopped, dcgmi fails as dcgmi does without one."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from sim.aptrepo import catalog
from sim.hosts.stubs import gpu_depth

pytestmark = pytest.mark.integration


def _start(tmp_path, *args: str) -> tuple[subprocess.Popen, object]:
    pid_file = tmp_path / "nv-hostengine.pid"
    script = catalog.NV_HOSTENGINE.format(version="3.3.9", pid_file=pid_file)
    engine = subprocess.Popen(["sh", "-c", script, "nv-hostengine", *args], start_new_session=True)
    deadline = time.monotonic() + 10
    # until a pid is recorded, or the start failed (the daemonising start exits 0 and its child writes it)
    while not (pid_file.exists() and pid_file.read_text().strip()) and engine.poll() in (None, 0) \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    return engine, pid_file


def test_the_unit_s_foreground_engine_is_reachable_until_it_stops(tmp_path):
    engine, pid_file = _start(tmp_path, "-n", "--service-account", "root")
    try:
        assert int(pid_file.read_text()) == engine.pid  # exec keeps the pid systemd watches
        assert gpu_depth.hostengine_running(str(pid_file))
    finally:
        engine.terminate()
        engine.wait(timeout=10)
    assert not gpu_depth.hostengine_running(str(pid_file))


def test_the_daemonised_engine_records_the_process_that_stays(tmp_path):
    starter, pid_file = _start(tmp_path)
    assert starter.wait(timeout=10) == 0
    pid = int(pid_file.read_text())
    try:
        assert pid != starter.pid and gpu_depth.hostengine_running(str(pid_file))
    finally:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while gpu_depth.hostengine_running(str(pid_file)) and time.monotonic() < deadline:
        time.sleep(0.02)  # a zombie until its parent (init) reaps it; /proc/<pid> goes then
    assert not gpu_depth.hostengine_running(str(pid_file))


def test_an_unknown_service_account_stops_the_engine_before_it_records_a_pid(tmp_path):
    engine, pid_file = _start(tmp_path, "-n", "--service-account", "no-such-user-clusterctl")
    assert engine.wait(timeout=10) == 1 and not pid_file.exists()
