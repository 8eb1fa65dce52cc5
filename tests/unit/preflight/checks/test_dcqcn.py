"""preflight/checks/dcqcn.py: ``evaluate`` judged on facts built directly (NHC style: the facts of a fault, never fixture text
edited to produce one), ``gather`` through a scripted transport on canned real-format outputs (a healthy
node passes; unreadable output is an ERROR)."""

from __future__ import annotations

import pytest

from preflight.checks import (
    dcqcn,
)
from preflight.parsers import ParseError, mlnx_qos
from preflight.parsers.mlnx_qos import MlnxQos, PfcPriority
from preflight.profiles import profile_of
from preflight.result import Verdict
from tests.helpers.preflight import ScriptedTransport, context, node

pytestmark = pytest.mark.unit

MLNX_QOS = """DCBX mode: OS controlled
Priority trust state: {trust}
dscp2prio mapping:
	prio:0 dscp:07,06,05,04,03,02,01,00,
	prio:3 dscp:31,30,29,28,27,26,25,24,
Receive buffer size (bytes): 130944,130944,0,0,0,0,0,0,
Cable len: 7
PFC configuration:
	priority    0   1   2   3   4   5   6   7
	enabled     0   0   0   {pfc}   0   0   0   0
	buffer      0   0   0   1   0   0   0   0
tc: 0 ratelimit: unlimited, tsa: vendor
	priority:  1
tc: 3 ratelimit: unlimited, tsa: ets, bw: 50%
	priority:  3
"""
ROCE_NICS = [
    {
        "device": "mlx5_0",
        "netdev": "ens1f0np0",
        "link_layer": "ethernet",
        "rate_gbps": 400,
        "numa_node": 0,
        "gpu": 0,
    }
]


def roce(trust="dscp", pfc="1", np_on="1", rp_on="1"):
    t = ScriptedTransport()
    t.on("n1", "cat", "/sys/class/net/ens1f0np0/ecn/roce_np/enable/3", reply=np_on + "\n")
    t.on("n1", "cat", "/sys/class/net/ens1f0np0/ecn/roce_rp/enable/3", reply=rp_on + "\n")
    t.on("n1", "mlnx_qos", "-i", "ens1f0np0", reply=MLNX_QOS.format(trust=trust, pfc=pfc))
    [result] = dcqcn.CHECK.run(context(t, node(rdma_nics=ROCE_NICS)))
    return result


def test_dcqcn_skips_infiniband_and_passes_a_configured_roce_port():
    [skipped] = dcqcn.CHECK.run(context(ScriptedTransport()))
    assert skipped.verdict is Verdict.SKIP
    assert (roce().verdict, roce().code) == (Verdict.PASS, "DCQCN_OK")


def port_qos(trust="dscp", pfc=True, np_on="1", rp_on="1") -> dcqcn.PortQos:
    """dcqcn's facts for one port, built: PFC on priority 3 only when ``pfc``."""
    table = [PfcPriority(p, pfc and p == 3, 1 if p == 3 else 0) for p in range(8)]
    return dcqcn.PortQos(np_on, rp_on, MlnxQos("OS controlled", trust, table))


@pytest.mark.parametrize(
    "kwargs, code",
    [
        ({"np_on": "0"}, "ECN_NP_OFF"),
        ({"rp_on": "0"}, "ECN_RP_OFF"),
        ({"trust": "pcp"}, "TRUST_NOT_DSCP"),
        ({"pfc": False}, "PFC_OFF"),
    ],
)
def test_each_missing_dcqcn_setting_fails(kwargs, code):
    n = node(rdma_nics=ROCE_NICS)
    profile = profile_of(n)
    assert dcqcn.CHECK.evaluate({"ens1f0np0": port_qos()}, profile, n)[0].verdict is Verdict.PASS
    [result] = dcqcn.CHECK.evaluate({"ens1f0np0": port_qos(**kwargs)}, profile, n)
    assert (result.verdict, result.code) == (Verdict.FAIL, code)


def test_mlnx_qos_without_pfc_table_is_an_error():
    with pytest.raises(ParseError):
        mlnx_qos.parse("Priority trust state: dscp\n")
    t = ScriptedTransport()
    for point in ("roce_np", "roce_rp"):
        t.on("n1", "cat", f"/sys/class/net/ens1f0np0/ecn/{point}/enable/3", reply="1\n")
    t.on("n1", "mlnx_qos", "-i", "ens1f0np0", reply="Priority trust state: dscp\n")
    [result] = dcqcn.CHECK.run(context(t, node(rdma_nics=ROCE_NICS)))
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER")
    assert "cannot parse `mlnx_qos -i ens1f0np0`" in result.reason


@pytest.mark.parametrize("np_on", ["yes", "1 1", "enabled"])
def test_an_ecn_switch_that_is_not_0_or_1_is_an_error_not_off(np_on):
    """The sysfs switch goes through the ecn-switch parser: anything but 0/1 is an ERROR naming the file (it
    used to FAIL the port as ECN_NP_OFF, blaming a setting nobody could read)."""
    result = roce(np_on=np_on)
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER")
    assert "/sys/class/net/ens1f0np0/ecn/roce_np/enable/3" in result.reason
    assert roce(np_on="0").code == "ECN_NP_OFF"
