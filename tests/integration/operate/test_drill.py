"""``clusterctl drill`` for real on loopback: three nodes' simulated vLLM processes (``python -m sim.vllm``, one
per IU on 127.0.67.N), each scored by the real agent, the real edge in front, the dev Consul; node n1 is
this machine (``ansible_connection: local``), so the drill's steps run through preflight's local transport:
``systemctl show`` for the MainPID (tests/helpers/units.py answers for n1's unit), ``kill``, ``systemctl
start``. Short phases; the measured table is printed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import types
from contextlib import ExitStack, contextmanager

import pytest
import yaml

from cli.main import main
from consul_io.client import ConsulIO
from sim.vllm.node import SimulatedNode
from sim.vllm.registration import IUService, register_on_catalog_node
from tests.helpers import units, wait_for
from tests.helpers.edge import free_port
from tests.integration.operate.pool import TRUE_PREFILL_TPS, node_agent, pushed_edge, sim_engines

pytestmark = pytest.mark.integration

NODES = 3
PORT = 8000
UNIT = "vllm-iu@0.service"
MIX = {"name": "drill-test-mix", "classes": {"short": {
    "share": 1, "prompt_tokens": {"mean": 200, "sigma": 0.3}, "output_tokens": 24, "slo": {"ttft_p99_ms": 3000}}}}


def host(n: int) -> str:
    return f"127.0.67.{n}"


def write_inventory(path) -> None:
    hosts = {}
    for n in range(1, NODES + 1):
        hosts[f"n{n}"] = {"ansible_host": host(n), "rack": "r1", "gpu_model": "h100-sxm", "gpu_count": 4,
                          "iu_size": 4, "iu_ports": [PORT], "drills_allowed": True}
    hosts["n1"]["ansible_connection"] = "local"  # the drill's target is this machine; n2, n3 are never touched
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))


@contextmanager
def process_pool(tmp_path, consul_addr, monkeypatch):
    """The edge's address; n1's IU is a unit of the systemctl stand-in, n2's and n3's plain processes."""
    units_dir = tmp_path / "units"
    units.install(tmp_path / "bin", units_dir)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    io = ConsulIO(consul_addr)
    agent_port = free_port(host(1))
    with ExitStack() as stack:
        stack.callback(units.stop_all, units_dir)
        units.declare(units_dir, UNIT, units.sim_vllm_argv(f"{host(1)}:{PORT}"), tmp_path / "n1-iu0.log")
        units.start(units_dir, UNIT)
        sim_engines(stack, (f"{host(n)}:{PORT}" for n in range(2, NODES + 1)))
        for n in range(1, NODES + 1):
            wait_for(lambda n=n: units.answers_health(f"{host(n)}:{PORT}"), 20, f"n{n}'s simulated vLLM answering /health")
            node = SimulatedNode(f"n{n}", "r1", tmp_path, rates=[0.0], consul_addr=consul_addr, host=host(n),
                                 warmup_s=0.0, seed=n)
            node.ius[0].server.server_close()  # the in-process IU is replaced by the process on PORT
            node.ius = [types.SimpleNamespace(address=f"{host(n)}:{PORT}")]
            register_on_catalog_node(io, IUService(node.iu_id(0), node.name, node.rack, host(n), PORT, (0, 1, 2, 3),
                                                   0), host(n))
            stack.enter_context(node_agent(node, agent_port, TRUE_PREFILL_TPS))
        edge = pushed_edge(stack, host(9), consul_addr, agent_port, NODES)
        yield edge.address, units_dir


def write_drill(tmp_path, kind: str, at_s: float = 5, hold_s: float = 5, duration_s: float = 16,
                recover_s_max: float = 6):
    (tmp_path / "mix.yml").write_text(yaml.safe_dump(MIX))
    drill = {"name": f"test-{kind}", "load": {"mix": "mix.yml", "rate_per_s": 6, "duration_s": duration_s,
                                              "seed": 3, "timeout_s": 8},
             "faults": [{"kind": kind, "at_s": at_s, "hold_s": hold_s}],
             "checks": {"failed_not_streaming_max": 0, "route_away_s_max": 2, "recover_s_max": recover_s_max,
                        "blast_radius_errors_max": 0}}
    path = tmp_path / f"{kind}.yml"
    path.write_text(yaml.safe_dump(drill, sort_keys=False))
    write_inventory(tmp_path / "hosts.yml")
    return path


def run_drill(tmp_path, edge_address: str, consul_addr: str, kind: str, **drill) -> tuple[int, dict]:
    path = write_drill(tmp_path, kind, **drill)
    try:
        main(["drill", str(path), "-i", str(tmp_path / "hosts.yml"), "--endpoint", f"http://{edge_address}",
              "--target", "n1-iu0", "--consul", consul_addr, "--out", str(tmp_path / "report"), "--json"])
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, json.loads((tmp_path / "report" / "drill.json").read_text())


RESTORED = {"engine_crash": f"{UNIT} started (a no-op when systemd restarted it)", "graceful_stop": f"{UNIT} started",
            "engine_stall": "SIGCONT to PID {pid}"}


@pytest.mark.parametrize("kind", ["engine_crash", "graceful_stop", "engine_stall"])
def test_a_unit_fault_under_load_is_measured_and_undone(kind, tmp_path, consul_addr, monkeypatch, capsys):
    with process_pool(tmp_path, consul_addr, monkeypatch) as (edge_address, units_dir):
        before = units.main_pid(units_dir, UNIT)
        code, result = run_drill(tmp_path, edge_address, consul_addr, kind)
        after = units.main_pid(units_dir, UNIT)
    with capsys.disabled():
        print(f"\n{(tmp_path / 'report' / 'drill.md').read_text()}")
    assert code in (0, 1), result
    assert result["error"] is None and not result["interrupted"], result["events"]
    fault = result["faults"][0]
    assert fault["kind"] == kind and fault["target"] == "n1-iu0"
    # the process was really signalled, and the undo really started a new one (or woke the frozen one)
    assert before and after and (after == before) == (kind == "engine_stall"), (before, after)
    assert result["restored"] == ["n1-iu0: " + RESTORED[kind].format(pid=before)]
    assert fault["requests_during_fault"] > 0
    if kind != "engine_stall":
        assert fault["served_during_fault"] == 0, fault  # a dead engine answers nothing
    assert fault["recover_s"] is not None, fault  # back in the edge's rotation before the load ended
    assert result["passed"] == (code == 0)
    written = {p.name for p in (tmp_path / "report").iterdir()}
    assert {"drill.json", "drill.md"} <= written


def frozen(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def test_ctrl_c_during_a_fault_undoes_it_says_so_and_exits_130(tmp_path, consul_addr, monkeypatch):
    with process_pool(tmp_path, consul_addr, monkeypatch) as (edge_address, units_dir):
        pid = units.main_pid(units_dir, UNIT)
        path = write_drill(tmp_path, "engine_stall", at_s=2, hold_s=40, duration_s=60)
        process = subprocess.Popen([sys.executable, "-m", "cli.main", "drill", str(path), "-i",
                                    str(tmp_path / "hosts.yml"), "--endpoint", f"http://{edge_address}",
                                    "--target", "n1-iu0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "COLUMNS": "200"})
        try:
            wait_for(lambda: frozen(pid), 30, "the drill's SIGSTOP")
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=30)
        finally:
            process.kill()
        assert not frozen(pid)  # woken before the drill exited
    assert process.returncode == 130, (out, err)
    assert f"undone: n1-iu0: SIGCONT to PID {pid}" in err, err
    assert "interrupted" in out and "FAILED" in out, out


def test_the_load_runs_past_its_duration_until_a_slow_restart_serves_again(tmp_path, consul_addr, monkeypatch):
    with process_pool(tmp_path, consul_addr, monkeypatch) as (edge_address, units_dir):
        # the undo's start brings up an engine that loads for 5 s before it listens, as vLLM loads weights
        units.declare(units_dir, UNIT, ["sh", "-c", 'sleep 5 && exec "$0" "$@"', *units.sim_vllm_argv(f"{host(1)}:{PORT}")],
                      tmp_path / "n1-iu0.log")
        code, result = run_drill(tmp_path, edge_address, consul_addr, "graceful_stop", at_s=3, hold_s=3,
                                 duration_s=8, recover_s_max=25)
    fault = result["faults"][0]
    assert result["error"] is None and not result["interrupted"], result["events"]
    # served again only after the nominal end of the load (8 s): measured because the load waited for it
    assert fault["recover_s"] is not None and fault["undone_s"] + fault["recover_s"] > 8, fault
    assert fault["recover_s"] >= 5, fault
    assert any("load ends: n1-iu0 served again" in line for line in result["events"]), result["events"]
    # and the load ended soon after, not at the recovery limit
    assert result["load"]["elapsed_s"] < fault["undone_s"] + 25, result["load"]
    assert code == 0 and result["passed"], result["checks"]
