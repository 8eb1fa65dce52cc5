"""Blocking queries: https://developer.hashicorp.com/consul/api-docs/features/blocking, and the query
parameter rules of ``agent/http.go`` (``parseWait``, ``parseConsistency``)."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from devconsul.server import DevConsulServer
from tests.helpers.devconsul import eventually

pytestmark = pytest.mark.integration


def _later(seconds: float, action) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_blocking_kv_get_wakes_on_change(c, api, name, cleanup):
    """"the HTTP request will 'hang' until a change in the system occurs" -- and returns promptly."""
    cleanup.prefixes.append(name)
    c.kv.put(f"{name}/k", "1")
    index = api.get(f"/v1/kv/{name}/k").headers["X-Consul-Index"]
    timer = _later(0.3, lambda: c.kv.put(f"{name}/k", "2"))
    start = time.monotonic()
    resp = api.get(f"/v1/kv/{name}/k?index={index}&wait=5s")
    elapsed = time.monotonic() - start
    timer.join()
    assert 0.25 < elapsed < 2.0
    assert int(resp.headers["X-Consul-Index"]) > int(index)
    assert resp.json()[0]["ModifyIndex"] == int(resp.headers["X-Consul-Index"])


def test_blocking_prefix_wakes_on_write_under_prefix(c, name, cleanup):
    """A recurse read blocks on its prefix and wakes when a key under it is created."""
    cleanup.prefixes.append(name)
    c.kv.put(f"{name}/nodes/a", "1")
    index, _ = c.kv.get(f"{name}/nodes/", recurse=True)
    timer = _later(0.3, lambda: c.kv.put(f"{name}/nodes/b", "2"))
    start = time.monotonic()
    new_index, entries = c.kv.get(f"{name}/nodes/", recurse=True, index=index, wait="5s")
    timer.join()
    assert time.monotonic() - start < 2.0
    assert int(new_index) > int(index)
    assert [e["Key"] for e in entries] == [f"{name}/nodes/a", f"{name}/nodes/b"]


def test_blocking_prefix_wakes_on_delete(c, name, cleanup):
    """Deleting a key under a watched prefix wakes the watcher (the prefix index moves)."""
    cleanup.prefixes.append(name)
    c.kv.put(f"{name}/d/a", "1")
    c.kv.put(f"{name}/d/b", "1")
    index, _ = c.kv.get(f"{name}/d/", recurse=True)
    timer = _later(0.3, lambda: c.kv.delete(f"{name}/d/b"))
    start = time.monotonic()
    new_index, entries = c.kv.get(f"{name}/d/", recurse=True, index=index, wait="5s")
    timer.join()
    assert time.monotonic() - start < 2.0
    assert int(new_index) > int(index)
    assert [e["Key"] for e in entries] == [f"{name}/d/a"]


def test_blocking_times_out_without_change(c, api, name, cleanup):
    """"wait ... specifying a maximum duration"; "A small random amount of additional wait time is
    added" (at most wait/16); with no change the same index comes back."""
    cleanup.prefixes.append(name)
    c.kv.put(f"{name}/k", "1")
    index = api.get(f"/v1/kv/{name}/k").headers["X-Consul-Index"]
    start = time.monotonic()
    resp = api.get(f"/v1/kv/{name}/k?index={index}&wait=1s")
    elapsed = time.monotonic() - start
    assert 1.0 <= elapsed < 3.0  # wait + at most wait/16 of jitter, plus scheduling slack
    assert resp.status_code == 200
    assert resp.headers["X-Consul-Index"] == index


def test_write_elsewhere_does_not_end_prefix_wait(c, name, cleanup):
    """A blocking read of one prefix is not answered early by writes to another prefix."""
    cleanup.prefixes += [name, f"{name}-other"]
    c.kv.put(f"{name}/mine/a", "1")
    index, _ = c.kv.get(f"{name}/mine/", recurse=True)
    timer = _later(0.2, lambda: c.kv.put(f"{name}-other/x", "2"))
    start = time.monotonic()
    new_index, _ = c.kv.get(f"{name}/mine/", recurse=True, index=index, wait="1s")
    timer.join()
    assert time.monotonic() - start >= 1.0
    assert new_index == index


def test_index_behind_current_returns_immediately(c, api, name, cleanup):
    """An index older than the current one answers at once (the client missed changes)."""
    cleanup.prefixes.append(name)
    c.kv.put(f"{name}/k", "1")
    c.kv.put(f"{name}/k", "2")
    index = int(api.get(f"/v1/kv/{name}/k").headers["X-Consul-Index"])
    start = time.monotonic()
    resp = api.get(f"/v1/kv/{name}/k?index={index - 1}&wait=5s")
    assert time.monotonic() - start < 1.0
    assert int(resp.headers["X-Consul-Index"]) == index


@pytest.mark.parametrize("query", ["index=abc", "index=-1", "index=1&wait=soon", "index=1&wait=10"])
def test_bad_index_or_wait_is_400(api, query):
    """http.go parseWait: "Invalid wait time" / "Invalid index" with 400."""
    resp = api.get(f"/v1/kv/anything?recurse&{query}")
    assert resp.status_code == 400
    assert resp.text.startswith(("Invalid wait time", "Invalid index"))


def test_stale_and_consistent_accepted_not_both(c, api, name, cleanup):
    """Consistency modes: ?stale and ?consistent are accepted; both at once is a 400."""
    cleanup.prefixes.append(name)
    c.kv.put(f"{name}/k", "1")
    assert api.get(f"/v1/kv/{name}/k?stale").status_code == 200
    assert api.get(f"/v1/kv/{name}/k?consistent").status_code == 200
    assert api.get(f"/v1/kv/{name}/k?stale&consistent").status_code == 400


def test_blocking_health_service_wakes_on_check_change(c, name, cleanup):
    """/v1/health/service supports blocking queries; a check turning passing wakes the watcher."""
    cleanup.services.append(name)
    c.agent.service.register(name, service_id=name, check={"TTL": "30s"})
    eventually(lambda: c.health.service(name)[1], lambda r: r != [])  # the catalog has the instance
    index, entries = c.health.service(name, passing=True)
    assert entries == []
    timer = _later(0.3, lambda: c.agent.check.ttl_pass(f"service:{name}"))
    start = time.monotonic()
    new_index, entries = c.health.service(name, passing=True, index=index, wait="5s")
    timer.join()
    assert time.monotonic() - start < 2.0
    assert int(new_index) > int(index)
    assert [e["Service"]["ID"] for e in entries] == [name]


def test_anonymous_blocking_query_does_not_park(dev_acl):
    started = time.monotonic()
    resp = requests.get(f"http://{dev_acl.address}/v1/catalog/services?index=999999&wait=10m", timeout=5)
    assert resp.status_code == 200 and resp.json() == {} and time.monotonic() - started < 1.0


def test_blocking_queries_per_client_are_capped():
    with DevConsulServer(addr="127.0.0.1:0", max_blocking_per_client=1) as server:
        import threading

        base = f"http://{server.address}"
        index = requests.get(f"{base}/v1/catalog/services", timeout=5).headers["X-Consul-Index"]
        parked = threading.Thread(
            target=requests.get, args=(f"{base}/v1/catalog/services?index={index}&wait=2s",), daemon=True
        )
        parked.start()
        time.sleep(0.3)
        resp = requests.get(f"{base}/v1/catalog/services?index={index}&wait=2s", timeout=5)
        assert resp.status_code == 429 and "too many blocking queries" in resp.text
        parked.join(5)
