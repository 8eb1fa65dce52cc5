"""``clusterctl rollout``: bad input changes nothing in Consul (exit 2, one line); start drives a rollout to its end;
status, pause, resume and abort work on the document from any controller; a second start takes it up."""

from __future__ import annotations

import json
import re
import time

import pytest
import yaml

from consul_io import layout
from consul_io.client import ConsulIO
from devconsul.server import DevConsulServer
from operate.rollout_plan import load_plan
from operate.rollout_run import begin
from sim.vllm.registration import IUService, register_on_catalog_node
from tests.helpers import run_cli

pytestmark = pytest.mark.integration
KEY = layout.rollout_key("dc1")


@pytest.fixture
def consul():
    with DevConsulServer(addr="127.0.65.1:0") as server:
        io = ConsulIO(server.address)
        for n, revision in enumerate(("old", "old", "new")):
            node = f"n{n}"
            register_on_catalog_node(io, IUService(f"{node}-iu0", node, "r1", f"127.0.65.{11 + n}", 8000, (0,), 0,
                                                   revision=revision), f"127.0.65.{11 + n}")
        yield server.address, io


def rollout_file(tmp_path, **changes):
    data = {"name": "r", "stable": "old", "canary": "new", "interval": "0.2s", "min_requests": 1,
            "steps": [{"weight": 50, "hold": "0.5s"}, {"weight": 100, "hold": "0.3s"}],
            "gates": [{"metric": "health_check_success", "min": 0.99}, {"metric": "ecc_events", "max": 0}]}
    data.update(changes)
    path = tmp_path / "rollout.yml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize(("changes", "words"), [
    ({"steps": [{"weight": 50, "hold": "1s"}, {"weight": 20, "hold": "1s"}, {"weight": 100, "hold": "1s"}]},
     "steps[1].weight: weights must rise step by step (the step before is 50) (got 20)"),
    ({"canary": "nobody-runs-this"}, "canary: no IU is registered with revision 'nobody-runs-this' (registered: "
                                     "new (1), old (2))"),
    ({"gates": [{"metric": "gpu_temperature", "max": 80}]}, "gates[0].metric: unknown metric"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_in_consul(consul, tmp_path, capsys, changes, words):
    address, io = consul
    code, out, err = run_cli(capsys, "rollout", "start", rollout_file(tmp_path, **changes), "--consul", address)
    assert code == 2, (out, err)
    assert words in err and len(err.strip().splitlines()) == 1
    assert io.kv_read(KEY) == (0, None)


def test_start_drives_the_rollout_to_promotion_and_status_shows_it(consul, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    address, io = consul
    code, out, err = run_cli(capsys, "rollout", "start", rollout_file(tmp_path), "--consul", address,
                             "--out", str(tmp_path / "report"))
    assert code == 0, (out, err)
    assert "started: old -> new" in out and "rollout r: promoted" in out
    report = json.loads((tmp_path / "report" / "rollout.json").read_text())
    assert report["document"]["state"] == "promoted" and report["evaluations"]
    code, out, _ = run_cli(capsys, "rollout", "status", "--consul", address, "--json")
    assert code == 0 and json.loads(out)["weight"] == 1.0
    # after promotion an operator can still send everything back to stable
    code, out, _ = run_cli(capsys, "rollout", "abort", "--consul", address, "--reason", "regression seen late")
    assert code == 0 and "canary weight │ 0%" in out.replace("|", "│")
    code, _, err = run_cli(capsys, "rollout", "pause", "--consul", address)
    assert code == 2 and "rollout r is aborted: nothing to pause" in err


def test_pause_resume_abort_from_another_controller_and_start_takes_it_up(consul, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    address, io = consul
    path = rollout_file(tmp_path, steps=[{"weight": 20, "hold": "1h"}, {"weight": 100, "hold": "1s"}])
    begin(io, load_plan(path), "dc1", time.time())  # a controller that then stopped
    code, out, _ = run_cli(capsys, "rollout", "status", "--consul", address)
    assert code == 0 and re.search(r"step\s+\S\s+1 of 2 \(since .*hold \d+ s left\)", out)
    for verb, state in (("pause", "paused"), ("resume", "progressing")):
        code, _, err = run_cli(capsys, "rollout", verb, "--consul", address)
        assert code == 0, err
        assert json.loads(io.kv_read(KEY)[1])["state"] == state
    another = rollout_file(tmp_path, name="other")
    code, _, err = run_cli(capsys, "rollout", "start", another, "--consul", address)
    assert code == 2 and "rollout 'r' (progressing) is in Consul; abort it first" in err
    code, _, _ = run_cli(capsys, "rollout", "abort", "--consul", address)
    doc = json.loads(io.kv_read(KEY)[1])
    assert code == 0 and (doc["state"], doc["weight"]) == ("aborted", 0)
    assert [e["event"] for e in doc["history"]] == ["start", "pause", "resume", "abort"]
    code, out, err = run_cli(capsys, "rollout", "status", "--consul", address)
    assert code == 0 and "abort by an operator" in out


def test_a_restarted_controller_takes_up_the_rollout_where_it_was(consul, tmp_path, capsys):
    address, io = consul
    path = rollout_file(tmp_path)
    _, doc, resumed = begin(io, load_plan(path), "dc1", time.time())
    assert not resumed
    code, out, err = run_cli(capsys, "rollout", "start", path, "--consul", address)
    assert code == 0, err
    assert "taken up from Consul" in out and "promoted" in out
    history = json.loads(io.kv_read(KEY)[1])["history"]
    assert [e["event"] for e in history] == ["start", "promote"]  # one start: the same rollout, not a new one
