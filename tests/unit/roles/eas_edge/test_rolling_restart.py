"""The eas_edge role's rolling restart (handlers/main.yml): a restarted edge is waited for twice before the play
(serial 1) goes on to the next edge: its /healthz, then every balancer's HAProxy sending to it again; the second
wait only for an edge that answered 200 (one without a routable IU is out of every balancer until preflight)."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import REPO

pytestmark = pytest.mark.unit

ROLE = REPO / "roles/eas_edge"
HEALTHZ, BALANCERS = "Wait for eas-edge", "Wait for the balancers to send to eas-edge"


def handlers() -> dict[str, dict]:
    return {h["name"]: h for h in yaml.safe_load((ROLE / "handlers/main.yml").read_text())}


def test_a_restart_waits_for_healthz_then_for_the_balancers_in_that_order():
    by_name = handlers()
    assert by_name["Restart eas-edge"]["notify"] == [HEALTHZ, BALANCERS]
    order = list(by_name)  # a flush runs the notified handlers in the order they are defined
    assert order.index("Restart eas-edge") < order.index(HEALTHZ) < order.index(BALANCERS)


def test_the_balancers_are_waited_for_only_for_an_edge_that_answered_200():
    handler = handlers()[BALANCERS]
    assert handler["ansible.builtin.include_tasks"] == "balancers.yml"
    assert "(_eas_edge_health.status | default(0)) == 200" in handler["when"]


def test_every_balancer_is_asked_about_this_edge_on_its_own_host():
    [task] = yaml.safe_load((ROLE / "tasks/balancers.yml").read_text())
    module = task["clusterctl.infra.haproxy_server_ready"]
    assert task["loop"] == "{{ groups['balancers'] | default([]) }}"
    assert task["delegate_to"] == "{{ _eas_edge_balancer_host }}"
    assert module["server"] == "{{ inventory_hostname }}"  # the balancer names each edge's server by its host
    assert "cluster_balancer" in task["vars"]["_eas_edge_balancer"]  # socket and backend from the cluster model
