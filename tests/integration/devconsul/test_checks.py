"""Checks: https://developer.hashicorp.com/consul/api-docs/agent/check (Register Check, TTL Check
Pass/Warn/Fail/Update), https://developer.hashicorp.com/consul/docs/services/usage/checks (TTL and HTTP
check semantics), and ``agent/checks/check.go`` for the exact output texts."""

from __future__ import annotations

import json
import time

import consul
import pytest
import requests

from tests.helpers.devconsul import wait_until

pytestmark = pytest.mark.integration


def _check(c, check_id: str) -> dict | None:
    return c.agent.checks().get(check_id)


def test_service_check_ids_default(c, name, cleanup):
    """One check: ID ``service:<id>``; several: ``service:<id>:<n>`` from 1; default name
    "Service '<name>' check"."""
    cleanup.services += [f"{name}-one", f"{name}-two"]
    c.agent.service.register(name, service_id=f"{name}-one", check=consul.Check.ttl("10s"))
    c.agent.service.register(name, service_id=f"{name}-two", check=consul.Check.ttl("10s"),
                             extra_checks=[consul.Check.ttl("10s")])
    checks = c.agent.checks()
    assert checks[f"service:{name}-one"]["Name"] == f"Service '{name}' check"
    assert {f"service:{name}-two:1", f"service:{name}-two:2"} <= set(checks)
    assert f"service:{name}-two" not in checks


def test_new_check_is_critical_unless_status_given(c, name, cleanup):
    """"Status ... Specifies the initial status of the health check"; the default is critical."""
    cleanup.services += [f"{name}-a", f"{name}-b"]
    c.agent.service.register(name, service_id=f"{name}-a", check={"TTL": "10s"})
    c.agent.service.register(name, service_id=f"{name}-b", check={"TTL": "10s", "Status": "passing"})
    assert _check(c, f"service:{name}-a")["Status"] == "critical"
    assert _check(c, f"service:{name}-b")["Status"] == "passing"


def test_ttl_pass_warn_fail_with_note(c, name, cleanup):
    """TTL Check Pass/Warn/Fail set passing/warning/critical; ?note becomes the Output."""
    cleanup.services.append(name)
    c.agent.service.register(name, check=consul.Check.ttl("10s"))
    cid = f"service:{name}"
    for call, status in ((c.agent.check.ttl_pass, "passing"), (c.agent.check.ttl_warn, "warning"),
                         (c.agent.check.ttl_fail, "critical")):
        assert call(cid, f"note-{status}") is True
        check = _check(c, cid)
        assert (check["Status"], check["Output"]) == (status, f"note-{status}")


def test_check_update_sets_status_and_output(c, api, name, cleanup):
    """TTL Check Update: PUT /v1/agent/check/update/:check_id with {"Status", "Output"}."""
    cleanup.services.append(name)
    c.agent.service.register(name, check=consul.Check.ttl("10s"))
    resp = api.put(f"/v1/agent/check/update/service:{name}", json={"Status": "warning", "Output": "load 0.93"})
    assert resp.status_code == 200
    check = _check(c, f"service:{name}")
    assert (check["Status"], check["Output"]) == ("warning", "load 0.93")


def test_check_update_rejects_unknown_status(api, c, name, cleanup):
    """agent_endpoint.go: "Invalid check status: '<s>'" with 400."""
    cleanup.services.append(name)
    c.agent.service.register(name, check=consul.Check.ttl("10s"))
    resp = api.put(f"/v1/agent/check/update/service:{name}", json={"Status": "ok"})
    assert resp.status_code == 400
    assert resp.text == "Invalid check status: 'ok'"


def test_update_unknown_check_is_404(api, name):
    """vetCheckUpdateWithAuthorizer: an unknown check ID is 404 "Unknown check ID ..."."""
    resp = api.put(f"/v1/agent/check/pass/{name}")
    assert resp.status_code == 404
    assert "Unknown check ID" in resp.text


def test_ttl_expiry_turns_critical_with_consul_output(c, name, cleanup):
    """A TTL check not updated within its TTL turns critical with "TTL expired (last output before
    timeout follows): <last output>" (check.go getExpiredOutput)."""
    cleanup.services.append(name)
    c.agent.service.register(name, check=consul.Check.ttl("1s"))
    cid = f"service:{name}"
    c.agent.check.ttl_pass(cid, "score=0.42")
    assert _check(c, cid)["Status"] == "passing"
    check = wait_until(lambda: (ch := _check(c, cid)) and ch["Status"] == "critical" and ch, timeout=4)
    assert check, "TTL check did not expire"
    assert check["Output"] == "TTL expired (last output before timeout follows): score=0.42"


def test_ttl_update_resets_timer(c, name, cleanup):
    """Each pass resets the TTL clock: updating every 0.5 s keeps a 1.5 s TTL check passing."""
    import time

    cleanup.services.append(name)
    c.agent.service.register(name, check=consul.Check.ttl("1500ms"))
    cid = f"service:{name}"
    for _ in range(6):
        c.agent.check.ttl_pass(cid)
        time.sleep(0.5)
        assert _check(c, cid)["Status"] == "passing"


def test_register_check_validation(api, name):
    """Register Check: a check with no TTL/HTTP/TCP definition is "TTL must be > 0 for TTL checks";
    an HTTP check needs an Interval; script checks are refused (agent.addCheck, a 500) while
    enable_script_checks is off, Consul's default."""
    resp = api.put("/v1/agent/check/register", json={"Name": name})
    assert resp.status_code == 400 and "TTL must be > 0" in resp.text
    resp = api.put("/v1/agent/check/register", json={"Name": name, "HTTP": "http://127.0.0.1:1/"})
    assert resp.status_code == 400 and "Interval must be > 0" in resp.text
    resp = api.put("/v1/agent/check/register", json={"Name": name, "Args": ["true"], "Interval": "10s"})
    assert resp.status_code == 500 and "Scripts are disabled" in resp.text


def test_register_check_for_unknown_service_is_404(api, name):
    """Register Check ServiceID must name a registered service: 404 "ServiceID ... does not exist"."""
    resp = api.put("/v1/agent/check/register", json={"Name": name, "TTL": "10s", "ServiceID": f"{name}-x"})
    assert resp.status_code == 404


def test_node_check_register_and_deregister(c, name):
    """Register Check without ServiceID makes a node-level check; ID defaults to Name."""
    assert c.agent.check.register(name, check=consul.Check.ttl("10s")) is True
    try:
        check = _check(c, name)
        assert check["ServiceID"] == "" and check["Status"] == "critical"
    finally:
        assert c.agent.check.deregister(name) is True
    assert _check(c, name) is None


@pytest.mark.parametrize(("answer", "expected"), [(200, "passing"), (429, "warning"), (503, "critical")])
def test_http_check_is_really_probed(c, name, cleanup, tiny_http, answer, expected):
    """HTTP check: "2xx code is passing, 429 Too Many Requests is a warning, anything else is a
    failure"; output "HTTP GET <url>: <code> <reason> Output: <body>"."""
    cleanup.services.append(name)
    tiny_http.status = answer
    c.agent.service.register(name, check=consul.Check.http(tiny_http.url, "1s"))
    cid = f"service:{name}"
    check = wait_until(lambda: (ch := _check(c, cid)) and ch["Output"] and ch, timeout=4)
    assert check, "HTTP check never ran"
    assert check["Status"] == expected
    assert check["Output"].startswith(f"HTTP GET {tiny_http.url}: {answer} ")
    assert check["Output"].endswith("Output: ok")
    assert check["Interval"] == "1s"
    assert tiny_http.hits >= 1


def test_http_check_follows_endpoint_changes(c, name, cleanup, tiny_http):
    """The probe repeats every interval: an endpoint going 200 -> 500 turns the check critical."""
    cleanup.services.append(name)
    c.agent.service.register(name, check=consul.Check.http(tiny_http.url, "1s"))
    cid = f"service:{name}"
    assert wait_until(lambda: _check(c, cid)["Status"] == "passing", timeout=4)
    tiny_http.status = 500
    assert wait_until(lambda: _check(c, cid)["Status"] == "critical", timeout=4)


def test_output_only_change_reaches_catalog_late(c, name, cleanup):
    """check_update_interval (https://developer.hashicorp.com/consul/docs/agent/config/config-files
    #check_update_interval, default 5m; local/state.go UpdateCheck): an output-only change is deferred,
    so the agent sees it at once while /v1/health keeps the last synced output; a status change syncs
    immediately. Readers that need fresh data must not rely on health-check Output."""
    import time

    cleanup.services.append(name)
    c.agent.service.register(name, check=consul.Check.ttl("30s"))
    cid = f"service:{name}"
    c.agent.check.ttl_pass(cid, "first")  # critical -> passing: synced at once

    def health_output() -> str | None:
        _, checks = c.health.checks(name)
        found = [ch for ch in checks if ch["CheckID"] == cid]
        return found[0]["Output"] if found and found[0]["Status"] == "passing" else None

    assert wait_until(lambda: health_output() == "first", timeout=3)
    c.agent.check.ttl_pass(cid, "second")
    assert _check(c, cid)["Output"] == "second"
    time.sleep(1.0)
    assert health_output() == "first"


@pytest.mark.parametrize("url", ["file:///etc/hostname", "data:text/plain,hello", "ftp://127.0.0.1/x"])
def test_http_check_accepts_only_http_and_https(dev, url):
    base = f"http://{dev.address}"
    body = {"Name": "web", "ID": "web1", "Check": {"HTTP": url, "Interval": "1s"}}
    assert requests.put(f"{base}/v1/agent/service/register", data=json.dumps(body), timeout=5).status_code == 200
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        check = requests.get(f"{base}/v1/agent/checks", timeout=5).json().get("service:web1", {})
        if check.get("Output"):
            break
        time.sleep(0.1)
    assert check["Status"] == "critical" and "unsupported protocol scheme" in check["Output"]
    assert "Output:" not in check["Output"]  # nothing was fetched (not: the data: URL's "hello")


def test_probe_thread_survives_an_exception(dev, monkeypatch):
    from devconsul import checks

    calls = {"n": 0}

    def flaky(defn):
        calls["n"] += 1
        if calls["n"] == 1:
            raise TypeError("odd answer")
        return "passing", "ok"

    monkeypatch.setattr(checks, "run_probe", flaky)
    base = f"http://{dev.address}"
    body = {"Name": "web", "ID": "web2", "Check": {"HTTP": "http://127.0.0.1:1/", "Interval": "1s"}}
    requests.put(f"{base}/v1/agent/service/register", data=json.dumps(body), timeout=5)
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and calls["n"] < 2:
        time.sleep(0.1)
    assert calls["n"] >= 2  # guards against: the TypeError ended the probe thread for good
