"""ConsulIO.health_service over real HTTP: every IU instance of every node, at two requests per refresh plus
one per service that changed, and the same answer a fresh reader gets.

Runs against a dev server, or the real Consul named by ``CONSUL_HTTP_ADDR`` (with ``CONSUL_HTTP_TOKEN``
when its ACLs are on): nodes registered through ``/v1/catalog/register`` under names unique to the run, and
deregistered afterwards. Only IU services (``vllm-iu-``) are read, so a real Consul should have none
of its own while this runs."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

from consul_io import layout
from consul_io.client import ConsulIO
from tests.helpers.devconsul import Api

pytestmark = pytest.mark.integration

NODES = 12


class Counted(ConsulIO):
    """A client that counts its HTTP requests (a hook on its own requests session)."""

    def __init__(self, address: str, token: str | None):
        super().__init__(address, token=token)
        self.requests: list[str] = []
        self.client.http.session.hooks["response"].append(
            lambda response, *args, **kwargs: self.requests.append(response.request.path_url.split("?")[0]))

    def refresh(self, **kwargs) -> tuple[int, list, list[str]]:
        self.requests.clear()
        index, entries = self.health_service(**kwargs)
        return index, entries, list(self.requests)


def _register(api: Api, node: str, address: str, status: str = "passing", node_status: str = "passing") -> None:
    iu = layout.iu_id(node, 0)
    answer = api.put("/v1/catalog/register", json={
        "Node": node, "Address": "127.0.75.1",
        "Service": {"ID": iu, "Service": layout.iu_service(node), "Address": address, "Port": 8000,
                    "Tags": [layout.node_tag(node)], "Meta": {"node": node}},
        "Checks": [{"CheckID": "node-up", "Name": "node up", "Status": node_status},
                   {"CheckID": layout.health_check_id(iu), "Name": "vLLM health", "Status": status,
                    "ServiceID": iu}]})
    assert answer.status_code == 200, answer.text


@pytest.fixture
def consul():
    """(address, token): the real Consul of ``CONSUL_HTTP_ADDR``, else a dev server of this test's own."""
    real = os.environ.get("CONSUL_HTTP_ADDR")
    if real:
        yield real.removeprefix("http://"), os.environ.get("CONSUL_HTTP_TOKEN")
        return
    from devconsul.server import DevConsulServer

    with DevConsulServer(addr="127.0.75.1:0") as server:
        yield server.address, None


@pytest.fixture
def cluster(consul):
    consul_addr, token = consul
    api = Api(consul_addr, token)
    nodes = [f"t{uuid.uuid4().hex[:6]}n{k:02d}" for k in range(NODES)]
    try:
        for node in nodes:
            _register(api, node, "127.0.75.10")
        yield consul_addr, token, api, nodes
    finally:
        for node in nodes:
            api.put("/v1/catalog/deregister", json={"Node": node})


def _mine(entries: list, nodes: list[str]) -> list:
    return [e for e in entries if e["Node"]["Node"] in nodes]


def _view(entries: list) -> dict:
    return {(e["Node"]["Node"], e["Service"]["ID"]): (e["Service"]["Address"],
                                                      sorted((c["CheckID"], c["Status"]) for c in e["Checks"]))
            for e in entries}


def test_a_refresh_reads_only_the_services_that_changed(cluster):
    address, token, api, nodes = cluster
    io = Counted(address, token)
    fresh = lambda: _view(_mine(ConsulIO(address, token=token).health_service()[1], nodes))  # noqa: E731
    cluster_wide = ["/v1/health/state/any", "/v1/catalog/services"]

    _, entries, cold = io.refresh()
    assert len(_mine(entries, nodes)) == NODES and cold[:2] == cluster_wide and len(cold) >= 2 + NODES
    _, entries, idle = io.refresh()
    assert idle == cluster_wide and _view(_mine(entries, nodes)) == fresh()

    _register(api, nodes[3], "127.0.75.10", status="critical")  # one IU's check changed
    _, entries, one = io.refresh()
    assert one == cluster_wide + [f"/v1/health/service/{layout.iu_service(nodes[3])}"]
    assert _view(_mine(entries, nodes)) == fresh()
    assert ("vllm-iu:" + layout.iu_id(nodes[3], 0) + ":health", "critical") in _view(entries)[
        (nodes[3], layout.iu_id(nodes[3], 0))][1]

    _register(api, nodes[5], "127.0.75.10", node_status="critical")  # a node check changed
    _, entries, node_check = io.refresh(passing=True)
    assert node_check == cluster_wide + [f"/v1/health/service/{layout.iu_service(nodes[5])}"]
    assert {e["Node"]["Node"] for e in _mine(entries, nodes)} == set(nodes) - {nodes[3], nodes[5]}

    _register(api, nodes[7], "127.0.75.77", status="critical")  # re-registered at a new address
    _, entries, moved = io.refresh()
    assert len(moved) >= 2 + NODES and _view(_mine(entries, nodes)) == fresh()
    assert _view(entries)[(nodes[7], layout.iu_id(nodes[7], 0))][0] == "127.0.75.77"


def test_a_blocking_refresh_wakes_on_a_check_change_and_reads_that_service(cluster):
    address, token, api, nodes = cluster
    io = Counted(address, token)
    index, _, _ = io.refresh()
    io.refresh()
    changer = threading.Timer(0.3, _register, (api, nodes[0], "127.0.75.10", "warning"))
    changer.start()
    started = time.monotonic()
    new_index, entries, read = io.refresh(index=index, wait_s=5.0)
    changer.join()
    assert time.monotonic() - started < 4.0 and new_index > index
    assert read == ["/v1/health/state/any", "/v1/catalog/services", f"/v1/health/service/{layout.iu_service(nodes[0])}"]
    statuses = _view(entries)[(nodes[0], layout.iu_id(nodes[0], 0))][1]
    assert ("vllm-iu:" + layout.iu_id(nodes[0], 0) + ":health", "warning") in statuses
