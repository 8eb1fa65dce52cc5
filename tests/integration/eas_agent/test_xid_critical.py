"""The agent process marks a unit critical in Consul for a catalogued XID: ``eas-agent run`` as its unit runs
it, its ``import pynvml`` the stand-in reading the node's GPU file, two simulated IUs on 127.0.73.2, the dev
Consul on 127.0.73.1. An XID is what the driver adds to the file (``xid``), which NVML's event API delivers to
the agent; the body the agent writes to Consul KV is what the edges route on."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import ExitStack

import pytest

from consul_io import layout
from consul_io.client import ConsulIO
from devconsul.server import DevConsulServer
from sim.vllm.fake_gpu import write_fake_gpu_file
from sim.vllm.node import SimulatedNode
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

FAST = {"interval_s": 0.1, "heartbeat_s": 0.5, "min_write_interval_s": 0.2, "write_rate_per_s": 5.0,
        "scrape_timeout_s": 0.4, "listen": "127.0.73.2:0"}
HOLD_S = 4.0


def entries(io: ConsulIO, node: str) -> dict:
    _, value = io.kv_read(layout.score_key(layout.DEFAULT_DATACENTER, node))
    return json.loads(value)["ius"] if value else {}


def log_xid(node: SimulatedNode, gpu: int, xid: int) -> None:
    """What the driver does on an XID: the GPU's event list grows (the stand-in's NVML events)."""
    data = json.loads(node.gpu_file.read_text())
    data["gpus"][gpu].setdefault("xid", []).append(xid)
    write_fake_gpu_file(node.gpu_file, data["gpus"])


@pytest.fixture
def agent(tmp_path):
    """(node, Consul client) with the agent process publishing both IUs passing."""
    with ExitStack() as stack:
        server = stack.enter_context(DevConsulServer(addr="127.0.73.1:0", node_name="n1"))
        io = ConsulIO(server.address)
        node = stack.enter_context(SimulatedNode("n1", "r1", tmp_path, rates=[0.5, 0.5], consul_addr=server.address,
                                                 host="127.0.73.2", warmup_s=0.0))
        node.write_config(xid_hold_s=HOLD_S, **FAST)
        proc = subprocess.Popen([sys.executable, "-m", "eas_agent.main", "run", "--config", str(node.config_path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=node.agent_env())
        stack.callback(proc.wait, 10)
        stack.callback(proc.terminate)
        wait_for(lambda: [e["status"] for e in entries(io, "n1").values()] == ["passing"] * 2, 30,
                 "both IUs passing in Consul")
        yield node, io


def test_an_xid_that_takes_the_unit_out_marks_it_critical_naming_the_xid(agent):
    node, io = agent
    logged = time.time()
    log_xid(node, 5, 95)  # GPU 5: the second IU's (4 GPUs each)
    wait_for(lambda: entries(io, "n1")["n1-iu1"]["status"] == "critical", 10, "n1-iu1 critical in Consul")
    seen = time.time() - logged
    unit = entries(io, "n1")["n1-iu1"]
    assert unit["reason"].startswith("GPU 5: XID 95 ROBUST_CHANNEL_UNCONTAINED_ERROR "), unit
    assert unit["reason"].endswith("(NVIDIA's action RESET_GPU; remediation rung gpu_reset)"), unit
    assert unit["components"]["xid_last"] == 95 and logged - 1 <= unit["components"]["xid_last_at"] <= time.time()
    assert entries(io, "n1")["n1-iu0"]["status"] == "passing"  # the other unit's GPUs logged nothing
    # the hold over, the unit comes back (its GPUs answer NVML and show no uncorrectable errors)
    wait_for(lambda: entries(io, "n1")["n1-iu1"]["status"] == "passing", HOLD_S + 5, "n1-iu1 passing again")
    back = time.time() - logged
    assert back >= HOLD_S
    print(f"\nXID 95 logged -> n1-iu1 critical in Consul KV after {seen:.2f} s, passing again after {back:.2f} s")


def test_an_xid_nvidia_says_to_ignore_leaves_the_unit_in_rotation(agent):
    node, io = agent
    log_xid(node, 1, 43)  # the driver already reset the faulting channel
    wait_for(lambda: entries(io, "n1")["n1-iu0"]["components"].get("xid_last") == 43, 10, "XID 43 published")
    time.sleep(0.5)
    assert entries(io, "n1")["n1-iu0"]["status"] == "passing"
