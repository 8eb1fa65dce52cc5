"""ACL tokens are sent explicitly on every Consul call the agent makes."""

from __future__ import annotations

import json
import os

import pytest

from consul_io.client import ConsulIO, ConsulUnavailable
from eas_agent.publisher import Publisher
from eas_agent.score import ScoreResult
from sim.vllm.registration import IUService, register_iu_service

pytestmark = pytest.mark.integration


@pytest.fixture
def acl_consul():
    if os.environ.get("CONSUL_HTTP_ADDR"):
        pytest.skip("needs a dev Consul started here with ACLs on")
    from devconsul.server import DevConsulServer

    with DevConsulServer(addr="127.0.0.1:0", acl_token="root-token-for-tests") as server:
        yield server.address


def test_publishing_with_token_and_refused_without(acl_consul, monkeypatch):
    monkeypatch.delenv("CONSUL_HTTP_TOKEN", raising=False)
    io = ConsulIO(acl_consul, token="root-token-for-tests")
    register_iu_service(io, IUService("n1-iu0", "n1", "r1", "127.0.0.1", 8000, (0,), 0), http_check=False)
    publisher = Publisher(io, key="clusterctl/eas/dc1/n1", node="n1", rack="r1", iu_ids=["n1-iu0"])
    assert publisher.step(0.0, {"n1-iu0": ScoreResult(0.3, "passing", "")}) is True
    assert (
        json.loads(io.client.kv.get("clusterctl/eas/dc1/n1", token="root-token-for-tests")[1]["Value"])["seq"]
        == 1
    )
    anonymous = ConsulIO(acl_consul)
    with pytest.raises(ConsulUnavailable):
        anonymous.kv_cas_write("clusterctl/eas/dc1/n1", "{}", 0)
    wrong = Publisher(
        ConsulIO(acl_consul, token="not-the-token"),
        key="clusterctl/eas/dc1/n1",
        node="n1",
        rack="r1",
        iu_ids=["n1-iu0"],
    )
    assert wrong.step(0.0, {"n1-iu0": ScoreResult(0.3, "passing", "")}) is False
    assert wrong.stats.errors == 1 and "not-the-token" not in wrong.stats.last_error  # secrets never logged
