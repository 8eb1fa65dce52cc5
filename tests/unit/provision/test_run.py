"""the run directory and events.jsonl carry task results: 0700 / 0600, and a
failed event write (full disk) never stops the run's bookkeeping."""

from __future__ import annotations

import json
import os
import stat

import pytest

from provision.run import EventLog, prepare_run_dir

pytestmark = pytest.mark.unit


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_run_dir_and_events_are_private(tmp_path):
    old = os.umask(0o022)
    try:
        run_dir = prepare_run_dir(tmp_path / ".state" / "runs" / "t1")
        with EventLog(run_dir / "events.jsonl") as events:
            events.write({"event": "runner_on_ok", "stdout": "HF_TOKEN=..."})
    finally:
        os.umask(old)
    assert mode(run_dir) == 0o700 and mode(run_dir / "runner") == 0o700
    assert mode(run_dir / "events.jsonl") == 0o600  # guards against: 0644 in a 0755 directory
    assert json.loads((run_dir / "events.jsonl").read_text())["event"] == "runner_on_ok"


def test_existing_files_are_tightened(tmp_path):
    run_dir = tmp_path / "r"
    (run_dir / "runner").mkdir(parents=True, mode=0o755)
    (run_dir / "events.jsonl").write_text("")
    (run_dir / "events.jsonl").chmod(0o644)
    prepare_run_dir(run_dir)
    EventLog(run_dir / "events.jsonl").close()
    assert mode(run_dir / "runner") == 0o700 and mode(run_dir / "events.jsonl") == 0o600


def test_a_failed_write_is_remembered_not_raised(tmp_path):
    events = EventLog(tmp_path / "events.jsonl")
    events.file.close()
    events.file = open("/dev/full", "w")  # every write: ENOSPC
    events.write({"event": "a"})
    events.write({"event": "b"})
    assert events.error and "later events were not recorded" in events.error
    events.close()
