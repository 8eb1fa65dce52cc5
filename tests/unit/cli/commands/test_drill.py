"""`clusterctl drill` (cli/commands/drill.py): the library listing, and bad input refused with one line and exit
2 before anything is contacted: a missing argument, a bad drill file, a host without drills_allowed."""

from __future__ import annotations

import pytest
import yaml

pytestmark = pytest.mark.unit

HOST = {"ansible_host": "127.0.67.1", "rack": "r1", "gpu_model": "h100-sxm", "gpu_count": 4, "iu_size": 4,
        "ansible_connection": "local"}


def inventory(tmp_path, **more) -> str:
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {"n1": {**HOST, **more}}}}))
    return str(path)


def test_list_shows_the_library(clusterctl):
    code, out, _ = clusterctl("drill", "--list", columns=200)
    assert code == 0
    for name in ("engine-crash", "engine-stall", "graceful-stop", "weights-missing", "consul-agent-down", "node-hang", "edge-restart"):
        assert name in out


def test_missing_arguments_are_named(clusterctl):
    code, _, err = clusterctl("drill", "engine-crash")
    assert code == 2 and "drill: missing -i/--inventory (or --list for the library)" in err


def test_a_bad_drill_file_is_one_line_exit_2(clusterctl, tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("name: b\nload: {rate_per_s: 1, duration_s: 10}\nfaults: [{kind: meteor, at_s: 1, hold_s: 1}]\n")
    code, _, err = clusterctl("drill", str(bad), "-i", inventory(tmp_path), "--endpoint", "127.0.67.9:1")
    assert code == 2
    assert err.strip().splitlines() == [f"error: {bad}: faults[0].kind: unknown fault kind; expected one of "
                                        f"engine_stall, engine_crash, graceful_stop, weights_missing, "
                                        f"consul_agent_down, node_hang, edge_restart, gpu_lost, ib_port_down (got 'meteor')"]


def test_a_host_without_drills_allowed_is_refused_before_anything_is_contacted(clusterctl, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs"))  # a systemctl or kill run would fail loudly
    code, _, err = clusterctl("drill", "engine-crash", "-i", inventory(tmp_path), "--endpoint", "127.0.67.9:1",
                              columns=300)
    assert code == 2 and "n1: drills_allowed is not true" in err and "--override-drills-allowed" in err


def test_drills_allowed_must_be_a_boolean(clusterctl, tmp_path):
    code, _, err = clusterctl("drill", "engine-crash", "-i", inventory(tmp_path, drills_allowed="yes"),
                              "--endpoint", "127.0.67.9:1", columns=300)
    assert code == 2 and "drills_allowed" in err and "must be true or false" in err


def test_a_drill_recovered_by_the_ladder_needs_consul_before_anything_is_touched(clusterctl, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs"))
    monkeypatch.delenv("CONSUL_HTTP_ADDR", raising=False)
    drill = tmp_path / "d.yml"
    drill.write_text("name: d\nrecovery: remediate\nload: {rate_per_s: 1, duration_s: 10}\n"
                     "faults: [{kind: engine_crash, at_s: 1, hold_s: 1}]\n")
    code, _, err = clusterctl("drill", str(drill), "-i", inventory(tmp_path, drills_allowed=True), "--endpoint",
                              "127.0.73.9:1", columns=300)
    assert code == 2 and err.strip().splitlines() == [
        f"error: {drill}: recovery: remediate needs Consul (--consul): the ladder drains the unit"]
