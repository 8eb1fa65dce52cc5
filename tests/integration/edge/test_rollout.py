"""The edge follows the rollout document in Consul: a change applies at once, a document it cannot read (Consul
gone, a value that does not parse) leaves the last good split in force, and a token that may not read the
document stops the edge at start."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace

import pytest

from consul_io import layout
from consul_io.acl import edge_policy
from consul_io.client import ConsulIO
from devconsul.server import DevConsulServer
from edge.config import AccessConfig, EdgeConfig
from edge.main import StartupError
from sim.vllm.registration import IUService, register_on_catalog_node
from tests.helpers.edge import RunningEdge, wait_for

pytestmark = pytest.mark.integration
KEY = layout.rollout_key("dc1")


def document(weight: float, state: str = "progressing") -> str:
    return json.dumps({"version": 1, "name": "r", "stable": "old", "canary": "new", "weight": weight,
                       "state": state, "updated": time.time()})


def config(address: str) -> EdgeConfig:
    return EdgeConfig(listen="127.0.65.2:0", consul=replace(EdgeConfig().consul, address=address),
                      access=AccessConfig(admin_listen="127.0.65.2:0"), seed=1)


@pytest.fixture
def consul():
    server = DevConsulServer(addr="127.0.65.1:0").start()
    io = ConsulIO(server.address)
    for n, revision in enumerate(("old", "new")):
        register_on_catalog_node(io, IUService(f"n{n}-iu0", f"n{n}", "r1", f"127.0.65.{11 + n}", 8000, (0,), 0,
                                               revision=revision), f"127.0.65.{11 + n}")
    yield server, io
    server.stop()


def test_the_edge_applies_a_change_at_once_and_keeps_the_last_good_document(consul):
    server, io = consul
    io.kv_put(KEY, document(0.2))
    edge = RunningEdge(config(server.address))
    try:
        rollout = edge.state.rollout
        assert rollout.doc.weight == 0.2  # read before serving
        written = time.monotonic()
        io.kv_put(KEY, document(0.0, "aborted"))
        wait_for(lambda: rollout.doc.state == "aborted", 2.0, "the abort applied")
        assert time.monotonic() - written < 2.0
        io.kv_put(KEY, '{"version": 1, "weight": "lots"}')
        wait_for(lambda: rollout.read_errors >= 1, 2.0, "the bad document seen")
        assert rollout.doc.state == "aborted"
        server.stop()  # Consul gone: the watch fails, the split stays
        time.sleep(0.5)
        assert rollout.doc.state == "aborted" and rollout.doc.effective_weight == 0
    finally:
        edge.close()


def test_a_token_that_may_not_read_the_document_stops_the_edge_at_start(tmp_path):
    """The edge's policy grants the read (consul_io/acl.py); a token without it (a policy from before rollouts)
    is refused at start, so no edge serves without knowing the split."""
    management = str(uuid.uuid4())
    with DevConsulServer(addr="127.0.65.3:0", acl_token=management) as server:
        admin = ConsulIO(server.address, token=management)
        rules = {"current": edge_policy(), "without-rollout": edge_policy().replace(
            f'key_prefix "{layout.ROLLOUT_PREFIX}/" {{ policy = "read" }}\n', "")}
        assert rules["current"] != rules["without-rollout"]
        edges = {}
        for name, text in rules.items():
            assert admin.client.http.put(lambda r: r.code, "/v1/acl/policy", data=json.dumps(
                {"Name": name, "Rules": text}), headers=admin.client.prepare_headers(management)) == 200
            secret = str(uuid.uuid4())
            assert admin.client.http.put(lambda r: r.code, "/v1/acl/token", data=json.dumps(
                {"SecretID": secret, "Policies": [{"Name": name}]}),
                headers=admin.client.prepare_headers(management)) == 200
            token_file = tmp_path / f"{name}.token"
            token_file.write_text(secret)
            token_file.chmod(0o600)
            edges[name] = replace(config(server.address), consul=replace(
                EdgeConfig().consul, address=server.address, token_file=str(token_file)))
        with pytest.raises(StartupError, match="kv/clusterctl/rollout/dc1/document"):
            RunningEdge(edges["without-rollout"])
        RunningEdge(edges["current"]).close()
