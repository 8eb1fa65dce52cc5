"""preflight's Consul calls carry the inventory's operator token (the token rule of roles/consul_agent/README.md:
``consul_token``, a vault value, else the 0600 ``consul_token_file``); before, preflight sent no token to
/v1/agent/self and read a token file whatever its mode."""

from __future__ import annotations

import pytest

from consul_io import layout
from consul_io.client import ConsulIO
from preflight import consul as consul_io
from sim.vllm.registration import IUService, register_iu_service
from tests.preflight.helpers import node

OPERATOR = "0d8e5a4c-5f0e-4c36-8a9b-3c1f2e7d9b11"


@pytest.fixture
def acl_consul():
    from devconsul.server import DevConsulServer

    with DevConsulServer(addr="127.0.0.1:0", acl_token=OPERATOR) as server:
        yield server.address


def in_maintenance(address: str, n) -> ConsulIO:
    """IU id -> in maintenance, for ``n``'s IUs registered in maintenance first (as provisioning leaves them)."""
    io = ConsulIO(address, token=OPERATOR)
    for iu in n.ius:
        register_iu_service(io, IUService(iu.id, n.name, n.rack, "127.0.0.1", iu.port, iu.gpus, iu.numa_node),
                            http_check=False)
        io.service_maintenance(iu.id, True, "waiting for preflight")
    return io


def maintenance_of(io, n) -> dict[str, bool]:
    _, entries = io.health_service()
    return {e["Service"]["ID"]: any(layout.is_maintenance_check(c["CheckID"]) for c in e["Checks"])
            for e in entries if e["Service"]["ID"] in {iu.id for iu in n.ius}}


def test_the_operator_token_as_a_vault_value_is_sent(acl_consul):
    n = node("t1", consul_http_addr=acl_consul, consul_token=OPERATOR)
    io = in_maintenance(acl_consul, n)
    assert consul_io.release(n) == ["t1-iu0", "t1-iu1"]
    assert maintenance_of(io, n) == {"t1-iu0": False, "t1-iu1": False}
    assert io.kv_get_json(layout.marker_key("dc1", "t1-iu0"))["by"] == "clusterctl preflight --release"


def test_the_operator_token_as_a_0600_file_is_read(acl_consul, tmp_path):
    path = tmp_path / "operator.token"
    path.write_text(OPERATOR + "\n")
    path.chmod(0o600)
    n = node("t2", consul_http_addr=acl_consul, consul_token_file=str(path))
    io = in_maintenance(acl_consul, n)
    assert set(consul_io.iu_services(n)) == {"t2-iu0", "t2-iu1"}
    assert consul_io.release(n) == ["t2-iu0", "t2-iu1"] and not any(maintenance_of(io, n).values())


def test_without_the_token_nothing_is_released(acl_consul):
    n = node("t3", consul_http_addr=acl_consul)
    io = in_maintenance(acl_consul, n)
    try:
        consul_io.release(n)
    except consul_io.ConsulUnavailable:
        pass  # refused outright, or (Consul filters what an anonymous request may see) nothing found
    assert maintenance_of(io, n) == {"t3-iu0": True, "t3-iu1": True}


def test_a_group_readable_token_file_is_one_line_naming_host_and_variable(acl_consul, tmp_path):
    path = tmp_path / "operator.token"
    path.write_text(OPERATOR)
    path.chmod(0o644)
    with pytest.raises(consul_io.ConsulUnavailable) as info:
        consul_io.iu_services(node("t4", consul_http_addr=acl_consul, consul_token_file=str(path)))
    message = str(info.value)
    assert message.startswith(f"t4: consul_token_file {path}: readable by group/others (mode 0644)")
    assert OPERATOR not in message and "\n" not in message
