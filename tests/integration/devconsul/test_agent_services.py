"""Agent services: https://developer.hashicorp.com/consul/api-docs/agent/service (Register Service,
Deregister Service, List Services, Get Service Configuration, Enable Maintenance Mode)."""

from __future__ import annotations

import consul
import pytest

from tests.helpers.devconsul import eventually

pytestmark = pytest.mark.integration


def test_register_defaults_id_to_name(c, name, cleanup):
    """Register Service: "ID ... If not provided, this is set to Name"."""
    cleanup.services.append(name)
    assert c.agent.service.register(name, port=8000, tags=["gpu"], meta={"iu": "0"}) is True
    svc = c.agent.services()[name]
    assert svc["ID"] == name and svc["Service"] == name
    assert svc["Port"] == 8000 and svc["Tags"] == ["gpu"] and svc["Meta"] == {"iu": "0"}
    assert svc["Weights"] == {"Passing": 1, "Warning": 1}


def test_reregister_replaces_definition(c, name, cleanup):
    """Registering an existing ID replaces the service definition."""
    cleanup.services.append(f"{name}-1")
    c.agent.service.register(name, service_id=f"{name}-1", port=8000, tags=["old"])
    c.agent.service.register(name, service_id=f"{name}-1", port=8001, tags=["new"])
    svc = c.agent.services()[f"{name}-1"]
    assert (svc["Port"], svc["Tags"]) == (8001, ["new"])


def test_get_service_configuration(c, api, name, cleanup):
    """Get Service Configuration returns the instance; an unknown ID is a 404."""
    cleanup.services.append(name)
    c.agent.service.register(name, port=9000)
    resp = api.get(f"/v1/agent/service/{name}")
    assert resp.status_code == 200 and resp.json()["Port"] == 9000
    assert api.get(f"/v1/agent/service/{name}-nope").status_code == 404
    cleanup.services.append(f"register-{name}")  # an ID that starts like an endpoint name
    c.agent.service.register(name, service_id=f"register-{name}", port=9001)
    assert api.get(f"/v1/agent/service/register-{name}").json()["Port"] == 9001


def test_deregister_removes_service_and_its_checks(c, name):
    """Deregister Service: "If there is an associated check, that is also deregistered"."""
    c.agent.service.register(name, check=consul.Check.ttl("10s"))
    assert f"service:{name}" in c.agent.checks()
    assert c.agent.service.deregister(name) is True
    assert name not in c.agent.services()
    assert f"service:{name}" not in c.agent.checks()


def test_deregister_unknown_service_is_404(api, name):
    """agent_endpoint.go vetServiceUpdateWithAuthorizer: 'Unknown service ID ...' with 404."""
    resp = api.put(f"/v1/agent/service/deregister/{name}")
    assert resp.status_code == 404
    assert "Unknown service ID" in resp.text


def test_register_without_name_is_400(api):
    """agent_endpoint.go AgentRegisterService: no Name is 400 "Missing service name"."""
    resp = api.put("/v1/agent/service/register", json={"Port": 1})
    assert resp.status_code == 400
    assert "Missing service name" in resp.text


def test_register_is_put_only(api):
    """Register Service is PUT; other methods get 405."""
    assert api.get("/v1/agent/service/register").status_code == 405


def test_service_maintenance_adds_critical_check(c, name, cleanup):
    """Enable Maintenance Mode: the service gets a critical check ``_service_maintenance:<id>`` with the
    reason as Notes; disabling removes it."""
    cleanup.services.append(name)
    c.agent.service.register(name, check={"TTL": "30s", "Status": "passing"})
    assert eventually(lambda: c.health.service(name, passing=True)[1], lambda r: r != []) != []
    assert c.agent.service.maintenance(name, "true", reason="draining") is True
    check = c.agent.checks()[f"_service_maintenance:{name}"]
    assert check["Status"] == "critical" and check["Notes"] == "draining" and check["ServiceID"] == name
    assert eventually(lambda: c.health.service(name, passing=True)[1], lambda r: r == []) == []
    assert c.agent.service.maintenance(name, "false") is True
    assert f"_service_maintenance:{name}" not in c.agent.checks()
    passing = eventually(lambda: c.health.service(name, passing=True)[1], lambda r: r != [])
    assert [e["Service"]["ID"] for e in passing] == [name]


def test_service_maintenance_needs_enable_and_known_service(api, c, name, cleanup):
    """Missing ?enable is 400 "Missing value for enable"; an unknown service is 404."""
    cleanup.services.append(name)
    c.agent.service.register(name)
    assert api.put(f"/v1/agent/service/maintenance/{name}").status_code == 400
    assert api.put(f"/v1/agent/service/maintenance/{name}-nope?enable=true").status_code == 404


def test_node_maintenance(c, name, cleanup):
    """Enable node maintenance (/v1/agent/maintenance): a critical ``_node_maintenance`` check takes every
    service on the node out of ?passing results."""
    cleanup.services.append(name)
    c.agent.service.register(name, check={"TTL": "30s", "Status": "passing"})
    try:
        assert c.agent.maintenance("true", reason="reboot") is True
        assert c.agent.checks()["_node_maintenance"]["Status"] == "critical"
        assert eventually(lambda: c.health.service(name, passing=True)[1], lambda r: r == []) == []
    finally:
        c.agent.maintenance("false")
    assert "_node_maintenance" not in c.agent.checks()


@pytest.mark.parametrize("key_case", ["lower", "Camel"])
def test_body_field_names_are_case_insensitive(api, name, cleanup, key_case):
    """Consul decodes field names case-insensitively (py-consul itself sends lower-case names)."""
    cleanup.services.append(name)
    body = {"name": name, "port": 7000} if key_case == "lower" else {"Name": name, "Port": 7000}
    assert api.put("/v1/agent/service/register", json=body).status_code == 200
    assert api.get(f"/v1/agent/service/{name}").json()["Port"] == 7000
