"""The edge's pool view against Consul (the dev server, or a real one when CONSUL_HTTP_ADDR is set): an IU's
owner is the catalog node it is registered on, whatever the registrant wrote."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from edge.feed import EdgeView
from edge.pool import AnomalyDetector
from tests.unit.edge.pool.test_pick import Clock

pytestmark = pytest.mark.integration


def test_impostor_registrations_through_consul_are_never_routable(consul_addr):
    """The cross-node takeover run against Consul (the dev server, or a real one when CONSUL_HTTP_ADDR is set):
    registrations made through /v1/catalog/register as another node's token could, read back by the edge's
    own client. Nothing routes to the attacker's address and each impostor is counted."""
    import uuid

    from consul_io.client import ConsulIO
    from tests.helpers.devconsul import Api

    api, suffix = Api(consul_addr, os.environ.get("CONSUL_HTTP_TOKEN")), uuid.uuid4().hex[:8]
    victim, attacker = f"own{suffix}a", f"own{suffix}b"

    def register(node, address, iu, service_address, meta_node):
        service = {"Service": f"vllm-iu-{node}", "ID": iu, "Address": service_address, "Port": 8000,
                   "Tags": ["rack:r1", f"node:{meta_node}"], "Meta": {"node": meta_node, "rack": "r1"}}
        answer = api.put("/v1/catalog/register", json={"Node": node, "Address": address, "Service": service})
        assert answer.status_code == 200, answer.text

    try:
        register(victim, "127.0.0.11", f"{victim}-iu0", "127.0.0.11", victim)
        register(attacker, "127.0.0.12", f"{attacker}-iu0", "127.0.0.12", attacker)
        register(attacker, "127.0.0.12", f"{victim}-iu0", "127.0.66.66", victim)  # the victim's IU id
        register(attacker, "127.0.0.12", f"{attacker}-iu1", "127.0.66.66", victim)  # Meta.node lies
        _, listing = ConsulIO(consul_addr, token=os.environ.get("CONSUL_HTTP_TOKEN")).health_service()
        ours = [e for e in listing if e["Node"]["Node"] in (victim, attacker)]
        assert len(ours) == 4
        view = EdgeView(detector=AnomalyDetector(), clock=Clock(100.0))
        view.apply_health(ours)
        assert {(e.node, e.iu_id, e.address) for e in view.snapshot().healthy} == {
            (victim, f"{victim}-iu0", "127.0.0.11"), (attacker, f"{attacker}-iu0", "127.0.0.12")}
        assert view.node_addresses() == {victim: "127.0.0.11", attacker: "127.0.0.12"}
        assert view.rejected_registrations == Counter(id_not_of_node=1, meta_node_mismatch=1)
    finally:
        for node in (victim, attacker):
            api.put("/v1/catalog/deregister", json={"Node": node})
