"""The drain filters of playbooks/filter_plugins/consul_filters.py on Consul's own check shapes (the agent's
``/v1/agent/checks`` mapping, the catalog's ``/v1/health/node`` list): which IUs serve, whether the node is in
maintenance and why."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.unit


def _filters():
    spec = importlib.util.spec_from_file_location("consul_filters", REPO / "playbooks/filter_plugins/consul_filters.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


F = _filters()


def check(check_id: str, status: str, service: str = "", notes: str = "") -> dict:
    return {"CheckID": check_id, "Status": status, "ServiceID": service, "Notes": notes,
            "ServiceName": f"vllm-iu-{service.split('-')[0]}" if service else ""}


AGENT = {
    "serfHealth": check("serfHealth", "passing"),
    "vllm-iu:n1-iu0:health": check("vllm-iu:n1-iu0:health", "passing", "n1-iu0"),
    "vllm-iu:n1-iu1:health": check("vllm-iu:n1-iu1:health", "warning", "n1-iu1"),
    "vllm-iu:n1-iu2:health": check("vllm-iu:n1-iu2:health", "critical", "n1-iu2"),
    "vllm-iu:n1-iu3:health": check("vllm-iu:n1-iu3:health", "passing", "n1-iu3"),
    "_service_maintenance:n1-iu3": check("_service_maintenance:n1-iu3", "critical", "n1-iu3", "waiting for preflight"),
}


def test_serving_ius_are_those_whose_every_check_passes_or_warns_outside_maintenance():
    assert F.consul_serving_ius(AGENT) == ["n1-iu0", "n1-iu1"]


def test_node_maintenance_takes_every_iu_out_unless_judged_as_if_released():
    held = {**AGENT, "_node_maintenance": check("_node_maintenance", "critical", notes="clusterctl reboot")}
    assert F.consul_serving_ius(held) == []
    assert F.consul_serving_ius(held, under_node_maintenance=True) == ["n1-iu0", "n1-iu1"]
    assert F.consul_node_maintenance(held) == "clusterctl reboot"
    assert F.consul_node_maintenance(list(held.values())) == "clusterctl reboot"  # the catalog's list shape
    assert F.consul_node_maintenance(AGENT) is None


def test_something_that_is_not_checks_is_an_error_naming_the_filter():
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="consul_serving_ius: expected Consul checks"):
        F.consul_serving_ius("not json")
