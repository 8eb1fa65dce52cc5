"""Behaviour that needs the dev server configured or restarted (skipped against a real Consul):
ACLs, persistence across restarts, reaping, deferred syncs, shutdown."""

from __future__ import annotations

import errno
import json
import threading
import time

import consul
import pytest
import requests

from devconsul import persist
from devconsul.server import DevConsulServer
from tests.helpers.devconsul import Api, client_for, wait_until

pytestmark = pytest.mark.integration

TOKEN = "3f0f3d3c-6a4e-4d7e-9a57-4d6c0e8b7a11"


# -- ACLs: https://developer.hashicorp.com/consul/api-docs/api-structure#authentication and each page's
# "ACL Required" column; default_policy = deny for the anonymous token.

@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/kv/some/key"),
    ("PUT", "/v1/kv/some/key"),
    ("DELETE", "/v1/kv/some/key"),
    ("PUT", "/v1/agent/service/register"),
    ("PUT", "/v1/agent/check/pass/x"),
    ("GET", "/v1/agent/self"),
])
def test_acl_missing_token_is_403(dev_server, method, path):
    """Without a token, reads of one object and all writes are 403 "Permission denied"."""
    server = dev_server(acl_token=TOKEN)
    resp = Api(server.address).request(method, path, json=[] if path == "/v1/txn" else None)
    assert resp.status_code == 403
    assert resp.text.startswith("Permission denied")


def test_acl_txn_vets_every_operation_before_applying_any(dev_server):
    """txn_endpoint.go preCheck: a KV operation the token may not do is a 409 with its error; none applies."""
    server = dev_server(acl_token=TOKEN)
    ops = [{"KV": {"Verb": "set", "Key": "some/key", "Value": ""}}]
    resp = Api(server.address).put("/v1/txn", json=ops)
    assert resp.status_code == 409
    assert resp.json()["Errors"][0]["What"].startswith("Permission denied")
    assert Api(server.address, TOKEN).get("/v1/kv/some/key").status_code == 404


def test_acl_wrong_token_is_403_acl_not_found(dev_server):
    """A token that does not exist is rejected with 403 "ACL not found"."""
    server = dev_server(acl_token=TOKEN)
    resp = Api(server.address, token="not-the-token").get("/v1/health/service/x")
    assert resp.status_code == 403 and resp.text == "ACL not found"


def test_acl_list_reads_are_filtered_not_denied(dev_server):
    """List endpoints answer an anonymous request with what it may see (nothing) and
    X-Consul-Results-Filtered-By-ACLs: true."""
    server = dev_server(acl_token=TOKEN)
    client_for(server, TOKEN).agent.service.register("svc", check={"TTL": "30s", "Status": "passing"})
    resp = Api(server.address).get("/v1/health/service/svc")
    assert resp.status_code == 200 and resp.json() == []
    assert resp.headers["X-Consul-Results-Filtered-By-ACLs"] == "true"


@pytest.mark.parametrize("style", ["header", "bearer"])
def test_acl_valid_token_via_header_or_bearer(dev_server, style):
    """API structure, Authentication: X-Consul-Token or "Authorization: Bearer <token>"."""
    server = dev_server(acl_token=TOKEN)
    headers = {"X-Consul-Token": TOKEN} if style == "header" else {"Authorization": f"Bearer {TOKEN}"}
    api = Api(server.address)
    assert api.put("/v1/kv/k", data=b"v", headers=headers).status_code == 200
    assert api.get("/v1/kv/k", headers=headers).status_code == 200


def test_acl_status_needs_no_token_and_py_consul_self_needs_explicit_token(dev_server):
    """/v1/status/* needs no token. py-consul 1.8.0 sends no token on agent.self(), so it is denied
    even from a client built with a token; the project passes the token explicitly."""
    server = dev_server(acl_token=TOKEN)
    client = client_for(server, TOKEN)
    assert client.status.leader()
    with pytest.raises(consul.ACLPermissionDenied):
        client.agent.self()
    assert Api(server.address, TOKEN).get("/v1/agent/self").status_code == 200


# -- persistence ------------------------------------------------------------------------------

def test_state_survives_restart_with_indexes(dev_server, tmp_path):
    """With a data dir, KV, services, checks and every index survive a restart, and new writes get
    higher indexes than any before (blocking readers never see the index go backwards)."""
    data = tmp_path / "consul"
    first = dev_server(data_dir=data)
    c = client_for(first)
    c.kv.put("eas/nodes/n1", "score=1", flags=3)
    c.agent.service.register("vllm-iu", service_id="iu-0", tags=["gpu"], check={"TTL": "30s"})
    c.agent.check.ttl_pass("service:iu-0", "ok")
    index_before, entry_before = c.kv.get("eas/nodes/n1")
    health_index_before, _ = c.health.service("vllm-iu")
    first.stop()

    second = dev_server(data_dir=data)
    c2 = client_for(second)
    index_after, entry_after = c2.kv.get("eas/nodes/n1")
    assert (index_after, entry_after) == (index_before, entry_before)
    assert c2.agent.services()["iu-0"]["Tags"] == ["gpu"]
    assert c2.agent.checks()["service:iu-0"]["Status"] == "passing"
    assert c2.health.service("vllm-iu")[0] == health_index_before
    c2.kv.put("eas/nodes/n2", "x")
    assert c2.kv.get("eas/nodes/n2")[1]["ModifyIndex"] > int(health_index_before)


def test_write_is_on_disk_when_acknowledged(dev_server, tmp_path):
    """A write answered 200 is already in the state file (crash-safe: temp file, fsync, rename)."""

    data = tmp_path / "consul"
    server = dev_server(data_dir=data)
    client_for(server).kv.put("k", "v")
    on_disk = json.loads((data / "state.json").read_text())
    assert [e["Key"] for e in on_disk["kv"]["entries"]] == ["k"]
    assert not [p for p in data.iterdir() if p.name != "state.json"]


def test_ttl_expiry_survives_restart(dev_server, tmp_path):
    """A TTL check's deadline is persisted: it expires on schedule after a restart."""
    data = tmp_path / "consul"
    first = dev_server(data_dir=data)
    client_for(first).agent.service.register("s", check={"TTL": "1s", "Status": "passing"})
    first.stop()
    second = dev_server(data_dir=data)
    c = client_for(second)
    assert wait_until(lambda: c.agent.checks()["service:s"]["Status"] == "critical", timeout=4)


# -- timers Consul keeps long by default ------------------------------------------------------

def test_deregister_critical_service_after_reaps(dev_server):
    """DeregisterCriticalServiceAfter: a service critical for longer is deregistered by the reaper
    (Consul: reaper every 30 s, minimum 1 min; shortened here)."""
    server = dev_server(check_reap_interval=0.2, check_deregister_interval_min=0.5)
    c = client_for(server)
    c.agent.service.register("doomed", check={"TTL": "10s", "DeregisterCriticalServiceAfter": "500ms"})
    c.agent.service.register("kept", check={"TTL": "10s", "Status": "passing",
                                            "DeregisterCriticalServiceAfter": "500ms"})
    assert wait_until(lambda: "doomed" not in c.agent.services(), timeout=4)
    assert "kept" in c.agent.services()


def test_deregister_after_below_minimum_is_raised(dev_server):
    """DeregisterCriticalServiceAfter below the minimum is raised to it (Consul: 1 minute)."""
    server = dev_server(check_reap_interval=0.1, check_deregister_interval_min=1.5)
    c = client_for(server)
    c.agent.service.register("s", check={"TTL": "10s", "DeregisterCriticalServiceAfter": "100ms"})
    time.sleep(0.8)
    assert "s" in c.agent.services()
    assert wait_until(lambda: "s" not in c.agent.services(), timeout=4)


def test_deferred_output_sync_arrives(dev_server):
    """The deferred output-only sync lands after check_update_interval/2 .. 1.5x."""
    server = dev_server(check_update_interval=0.4)
    c = client_for(server)
    c.agent.service.register("s", check={"TTL": "30s"})
    c.agent.check.ttl_pass("service:s", "first")
    c.agent.check.ttl_pass("service:s", "second")
    assert wait_until(lambda: c.health.checks("s")[1][0]["Output"] == "second", timeout=3)


# -- shutdown ---------------------------------------------------------------------------------

def test_stop_is_prompt_with_parked_queries_and_leaves_no_threads(dev_server, tiny_http):
    """stop() ends parked blocking queries, probe threads and connection threads at once."""
    before = set(threading.enumerate())
    server = dev_server()
    c = client_for(server)
    c.agent.service.register("web", check=consul.Check.http(tiny_http.url, "1s"))
    index, _ = c.kv.get("x")
    errors: list[BaseException] = []

    def park() -> None:
        try:
            requests.get(f"http://{server.address}/v1/kv/x?index={index}&wait=60s", timeout=30)
        except requests.RequestException as exc:
            errors.append(exc)

    parked = [threading.Thread(target=park) for _ in range(5)]
    for t in parked:
        t.start()
    assert wait_until(lambda: server.state.feed.watcher_count() == 5, timeout=10)
    start = time.monotonic()
    server.stop()
    stop_seconds = time.monotonic() - start
    for t in parked:
        t.join(5)
    leftover = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("devconsul")]
    assert (stop_seconds < 5.0, leftover) == (True, [])


def test_full_disk_loses_no_acknowledged_write(tmp_path, monkeypatch, tally):
    state = switchable_disk(monkeypatch)
    data = tmp_path / "consul"
    acked: dict[str, str] = {}
    refused: set[str] = set()
    lock = threading.Lock()
    with DevConsulServer(addr="127.0.0.1:0", data_dir=data) as server:
        base = f"http://{server.address}"

        def writer(w: int) -> None:
            session = requests.Session()
            for i in range(50):
                key = f"w{w}/{i}"
                resp = session.put(f"{base}/v1/kv/{key}", data=key.encode(), timeout=15)
                with lock:
                    (acked.__setitem__(key, key) if resp.status_code == 200 else refused.add(key))

        def flip() -> None:
            for _ in range(6):
                time.sleep(0.15)
                state["on"] = not state["on"]
            state["on"] = False

        workers = [threading.Thread(target=writer, args=(w,)) for w in range(4)] + [threading.Thread(target=flip)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(60)
    assert acked and len(acked) + len(refused) == 200
    with DevConsulServer(addr="127.0.0.1:0", data_dir=data) as server:  # restart from what reached the disk
        keys = requests.get(f"http://{server.address}/v1/kv/?keys", timeout=5).json() or []
        stored = set(keys)
    assert set(acked) <= stored, sorted(set(acked) - stored)[:5]  # no acknowledged write lost
    assert not (refused & stored), sorted(refused & stored)[:5]  # no refused write applied
    tally.fault("full disk under the data dir (6 flips, 4 writers)")
    tally.inputs("KV writes during the full-disk flips", len(acked) + len(refused))


def switchable_disk(monkeypatch) -> dict:
    """The data dir's disk, full while ``["on"]`` is true: every state write fails with ENOSPC."""
    real = persist.write_atomically
    full = {"on": False}

    def maybe_full(path, text):
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, text)

    monkeypatch.setattr(persist, "write_atomically", maybe_full)
    return full


def test_write_that_cannot_be_made_durable_is_not_applied(tmp_path, monkeypatch):
    """on a full disk a PUT answered 500 and was still applied; a retry with ?cas=0 said false."""
    full = switchable_disk(monkeypatch)
    with DevConsulServer(addr="127.0.0.1:0", data_dir=tmp_path / "data") as server:
        base = f"http://{server.address}"
        assert requests.put(f"{base}/v1/kv/keep", data=b"1", timeout=5).json() is True
        full["on"] = True
        started = time.monotonic()
        resp = requests.put(f"{base}/v1/kv/fill", data=b"x" * 60_000, timeout=15)
        assert resp.status_code == 500 and "not applied" in resp.text
        assert time.monotonic() - started < 5  # guards against: 10 s
        assert requests.get(f"{base}/v1/kv/fill", timeout=5).status_code == 404
        resp = requests.delete(f"{base}/v1/kv/keep", timeout=5)  # refused before it is applied
        assert resp.status_code == 500 and "not applied" in resp.text
        assert requests.get(f"{base}/v1/kv/keep?raw", timeout=5).content == b"1"
        full["on"] = False
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the persister retries every second
            resp = requests.put(f"{base}/v1/kv/fill?cas=0", data=b"x", timeout=5)
            if resp.status_code == 200:
                break
            time.sleep(0.2)
        assert resp.json() is True
        full["on"] = True


def _recovered(base: str, full: dict) -> None:
    """Free the disk and wait until the persister has written the state again (it retries every second)."""
    full["on"] = False
    deadline = time.monotonic() + 5
    while requests.put(f"{base}/v1/kv/probe", data=b"1", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the persister never recovered"
        time.sleep(0.2)


def test_catalog_write_that_cannot_be_made_durable_is_not_applied(tmp_path, monkeypatch):
    """Guards against: a catalog write on a full disk was answered 500 "not durable" and stayed applied in memory
    (served to readers, and written out once the disk had room), so a client could not tell what held."""
    full = switchable_disk(monkeypatch)
    with DevConsulServer(addr="127.0.0.1:0", data_dir=tmp_path / "data", node_name="n1") as server:
        base = f"http://{server.address}"

        def put(path, body=None):
            return requests.put(f"{base}{path}", data=json.dumps(body) if body is not None else None, timeout=15)

        web1 = {"Name": "web", "ID": "web1", "Port": 8001, "Check": {"TTL": "60s", "Status": "passing"}}
        assert put("/v1/agent/service/register", web1).status_code == 200
        full["on"] = True
        resp = put("/v1/agent/service/register", {"Name": "web", "ID": "web2", "Port": 8002})
        assert resp.status_code == 500 and "not applied" in resp.text
        assert requests.get(f"{base}/v1/agent/service/web2", timeout=5).status_code == 404
        assert [e["ServiceID"] for e in requests.get(f"{base}/v1/catalog/service/web", timeout=5).json()] == ["web1"]

        _recovered(base, full)
        full["on"] = True  # a change to what exists, and a check update: both undone
        resp = put("/v1/agent/service/register", {**web1, "Port": 9001, "Check": {"TTL": "60s"}})
        assert resp.status_code == 500 and "not applied" in resp.text
        assert requests.get(f"{base}/v1/agent/service/web1", timeout=5).json()["Port"] == 8001
        _recovered(base, full)
        full["on"] = True
        resp = put("/v1/agent/check/fail/service:web1")
        assert resp.status_code == 500 and "not applied" in resp.text
        health = requests.get(f"{base}/v1/health/service/web?passing", timeout=5).json()
        assert [e["Service"]["ID"] for e in health] == ["web1"]

        _recovered(base, full)
        full["on"] = True  # a client agent's sync, through the server's catalog endpoint
        resp = put("/v1/catalog/register", {"Node": "n2", "Address": "127.0.0.2",
                                            "Service": {"Name": "web", "ID": "web3", "Port": 8003}})
        assert resp.status_code == 500 and "not applied" in resp.text
        assert requests.get(f"{base}/v1/catalog/node/n2", timeout=5).json() is None
        _recovered(base, full)
    on_disk = json.loads((tmp_path / "data" / "state.json").read_text())
    assert [s["id"] for s in on_disk["catalog"]["services"] if s["name"] == "web"] == ["web1"]
