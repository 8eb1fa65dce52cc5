"""preflight/checks/consul.py: ``evaluate`` judged on facts built directly (NHC style: the facts of a fault, never fixture text
edited to produce one), ``gather`` through a scripted transport on canned real-format outputs (a healthy
node passes; unreadable output is an ERROR)."""

from __future__ import annotations

from preflight.checks import (
    consul,
)
from preflight.consul import ServiceState
from preflight.profiles import profile_of
from preflight.result import Verdict
from tests.preflight.helpers import node


def judge_consul(**facts):
    n = node()
    return consul.CHECK.evaluate(consul.ConsulFacts("127.0.0.1:8500", **facts), profile_of(n), n)[0]


def services(*ids, maintenance=()):
    return {i: ServiceState(i, "n1", "n1", {f"_service_maintenance:{i}": "critical"} if i in maintenance else {})
            for i in ids}


def test_consul_judged_on_what_the_agent_said():
    alive = {"serf_health": "passing"}
    ok = judge_consul(alive=alive, services=services("n1-iu0", "n1-iu1", maintenance=("n1-iu1",)))
    assert (ok.verdict, ok.code) == (Verdict.PASS, "CONSUL_OK") and "in maintenance: n1-iu1" in ok.reason
    down = judge_consul(agent_error="connection refused")
    assert (down.verdict, down.code, down.reason) == (Verdict.FAIL, "CONSUL_AGENT_DOWN",
                                                       "Consul at 127.0.0.1:8500: connection refused")
    sick = judge_consul(alive={"serf_health": "critical"}, services=services("n1-iu0", "n1-iu1"))
    assert (sick.verdict, sick.code) == (Verdict.FAIL, "CONSUL_NODE_UNHEALTHY")
    missing = judge_consul(alive=alive, services=services("n1-iu0"))
    assert (missing.verdict, missing.code, missing.reason) == (Verdict.FAIL, "CONSUL_SERVICE_MISSING",
                                                               "not registered in Consul: n1-iu1")
    unread = judge_consul(alive=alive, services_error="ACL not found")
    assert (unread.verdict, unread.code) == (Verdict.ERROR, "GATHER")
