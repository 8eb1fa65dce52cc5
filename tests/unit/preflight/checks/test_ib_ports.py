"""preflight/checks/ib_ports.py: ``evaluate`` judged on facts built directly (NHC style: the facts of a fault, never fixture text
edited to produce one), ``gather`` through a scripted transport on canned real-format outputs (a healthy
node passes; unreadable output is an ERROR)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from preflight import parsers
from preflight.checks import (
    ib_ports,
)
from preflight.profiles import profile_of
from preflight.result import Verdict
from tests.helpers.preflight import ScriptedTransport, context, fixture_text, node

pytestmark = pytest.mark.unit

IB_NICS = [
    {"device": f"mlx5_{i}", "netdev": f"ibp{i}s0", "rate_gbps": 400, "numa_node": i // 2} for i in range(4)
]


def ports(text: str, nics=IB_NICS):
    t = ScriptedTransport().on("n1", "ibstat", reply=text)
    [result] = ib_ports.CHECK.run(context(t, node(rdma_nics=nics)))
    return result


def ibstat_text() -> str:
    return fixture_text("ibstat", "h100-hgx-cx7-ndr400-ib-plus-roce-storage.txt")


def test_active_ports_at_the_expected_rate_pass():
    assert (ports(ibstat_text()).verdict, ports(ibstat_text()).code) == (Verdict.PASS, "PORTS_OK")


def judge_ports(ibstat, nics=IB_NICS):
    n = node(rdma_nics=nics)
    [result] = ib_ports.CHECK.evaluate(ibstat, profile_of(n), n)
    return result


def with_port(ibstat, ca_name: str, **fields):
    """The ibstat facts with port 1 of ``ca_name`` changed."""
    cas = [replace(ca, ports=[replace(p, **fields) if p.port == 1 else p for p in ca.ports])
           if ca.name == ca_name else ca for ca in ibstat.cas]
    return replace(ibstat, cas=cas)


def test_a_down_port_fails():
    down = with_port(parsers.parse("ibstat", ibstat_text()), "mlx5_1", state="Down", physical_state="Disabled")
    result = judge_ports(down)
    assert (result.verdict, result.code) == (Verdict.FAIL, "PORT_DOWN")
    assert result.reason.startswith("mlx5_1:1 is Down/Disabled")


def test_wrong_rate_missing_port_and_link_layer_fail():
    healthy = parsers.parse("ibstat", ibstat_text())
    assert judge_ports(with_port(healthy, "mlx5_0", rate_gbps=200)).code == "PORT_RATE"
    missing = IB_NICS + [{"device": "mlx5_42", "netdev": "ibp99s0", "rate_gbps": 400, "numa_node": 1}]
    assert judge_ports(healthy, missing).code == "PORT_MISSING"
    roce = [dict(n, link_layer="ethernet") for n in IB_NICS]
    assert judge_ports(healthy, roce).code == "LINK_LAYER"


def test_garbage_ibstat_is_an_error():
    result = ports(fixture_text("ibstat", "garbage-command-not-found.txt"))
    assert result.verdict is Verdict.ERROR
