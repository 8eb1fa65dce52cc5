"""KV contract: https://developer.hashicorp.com/consul/api-docs/kv (Read Key, Create/Update Key,
Delete Key) and ``agent/kvs_endpoint.go`` for the details the page leaves implicit."""

from __future__ import annotations

import base64
import threading

import pytest
import requests

from devconsul.server import DevConsulServer
from tests.helpers.devconsul import _client

pytestmark = pytest.mark.integration


def test_read_missing_key_is_404_with_index(api, name):
    """Read Key: "If no key exists at the given path, a 404 is returned"; reads carry X-Consul-Index."""
    resp = api.get(f"/v1/kv/{name}/missing")
    assert resp.status_code == 404
    assert int(resp.headers["X-Consul-Index"]) >= 1
    assert resp.headers["X-Consul-KnownLeader"] == "true"
    assert "X-Consul-LastContact" in resp.headers


def test_put_then_read_entry_fields(c, api, name, cleanup):
    """Read Key response: a list with Key, Value (base64), Flags, CreateIndex, ModifyIndex, LockIndex;
    ModifyIndex is what X-Consul-Index reports for a single key."""
    cleanup.prefixes.append(name)
    assert c.kv.put(f"{name}/a", "hello", flags=42) is True
    resp = api.get(f"/v1/kv/{name}/a")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("application/json")
    [entry] = resp.json()
    assert entry["Key"] == f"{name}/a"
    assert base64.b64decode(entry["Value"]) == b"hello"
    assert entry["Flags"] == 42
    assert entry["LockIndex"] == 0
    assert entry["CreateIndex"] == entry["ModifyIndex"]
    assert int(resp.headers["X-Consul-Index"]) == entry["ModifyIndex"]


def test_update_moves_modify_index_keeps_create_index(c, name, cleanup):
    """CreateIndex is the index that created the entry; ModifyIndex the last one that modified it."""
    cleanup.prefixes.append(name)
    c.kv.put(f"{name}/k", "1")
    _, first = c.kv.get(f"{name}/k")
    c.kv.put(f"{name}/k", "2")
    _, second = c.kv.get(f"{name}/k")
    assert second["CreateIndex"] == first["CreateIndex"]
    assert second["ModifyIndex"] > first["ModifyIndex"]
    assert second["Value"] == b"2"


def test_empty_value_is_null(c, api, name, cleanup):
    """A key with no data has Value null (Go encodes a nil []byte as null)."""
    cleanup.prefixes.append(name)
    assert c.kv.put(f"{name}/empty", "") is True
    [entry] = api.get(f"/v1/kv/{name}/empty").json()
    assert entry["Value"] is None


def test_raw_returns_bare_value(c, api, name, cleanup):
    """Read Key ?raw: "the response is just the raw value of the key, without any encoding"."""
    cleanup.prefixes.append(name)
    c.kv.put(f"{name}/raw", b"\x00\x01binary")
    resp = api.get(f"/v1/kv/{name}/raw?raw")
    assert resp.status_code == 200
    assert resp.content == b"\x00\x01binary"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"


def test_recurse_lists_prefix_sorted(c, name, cleanup):
    """?recurse treats the key as a prefix; entries come back sorted by key; other prefixes excluded."""
    cleanup.prefixes.append(name)
    for key in ("b", "a/2", "a/1", "ab"):
        c.kv.put(f"{name}/{key}", key)
    c.kv.put(f"{name}x/other", "no")
    cleanup.prefixes.append(f"{name}x")
    _, entries = c.kv.get(f"{name}/a", recurse=True)
    assert [e["Key"] for e in entries] == [f"{name}/a/1", f"{name}/a/2", f"{name}/ab"]


def test_recurse_index_is_highest_modify_index_under_prefix(c, api, name, cleanup):
    """A prefix read's X-Consul-Index is the highest ModifyIndex under the prefix (writes elsewhere
    do not move it), so a reader can block on exactly its prefix."""
    cleanup.prefixes += [name, f"{name}-elsewhere"]
    c.kv.put(f"{name}/p/1", "1")
    c.kv.put(f"{name}/p/2", "2")
    c.kv.put(f"{name}-elsewhere/x", "3")
    resp = api.get(f"/v1/kv/{name}/p/?recurse")
    assert int(resp.headers["X-Consul-Index"]) == max(e["ModifyIndex"] for e in resp.json())


def test_recurse_missing_prefix_is_404(api, name):
    """Read Key ?recurse with nothing under the prefix: 404 (no entries)."""
    resp = api.get(f"/v1/kv/{name}/nothing/?recurse")
    assert resp.status_code == 404


def test_keys_with_separator(c, api, name, cleanup):
    """?keys returns key names only; ?separator lists keys only up to the given separator."""
    cleanup.prefixes.append(name)
    for key in ("n/1/score", "n/1/load", "n/2/score", "top"):
        c.kv.put(f"{name}/{key}", "v")
    assert api.get(f"/v1/kv/{name}/?keys").json() == [
        f"{name}/n/1/load", f"{name}/n/1/score", f"{name}/n/2/score", f"{name}/top",
    ]
    assert api.get(f"/v1/kv/{name}/?keys&separator=/").json() == [f"{name}/n/", f"{name}/top"]
    assert api.get(f"/v1/kv/{name}/n/?keys&separator=/").json() == [f"{name}/n/1/", f"{name}/n/2/"]


def test_keys_on_missing_prefix_is_404(api, name):
    """kvs_endpoint.go KVSGetKeys: no keys under a non-empty prefix is a 404."""
    assert api.get(f"/v1/kv/{name}/none/?keys").status_code == 404


def test_cas_zero_creates_only(c, name, cleanup):
    """Create/Update ?cas: "If the index is 0, Consul will only put the key if it does not already exist"."""
    cleanup.prefixes.append(name)
    assert c.kv.put(f"{name}/lock", "first", cas=0) is True
    assert c.kv.put(f"{name}/lock", "second", cas=0) is False
    assert c.kv.get(f"{name}/lock")[1]["Value"] == b"first"


def test_cas_index_must_match(c, api, name, cleanup):
    """?cas=N: "the key is only set if the index matches the ModifyIndex of that key"; the answer is false."""
    cleanup.prefixes.append(name)
    c.kv.put(f"{name}/k", "v1")
    modify = c.kv.get(f"{name}/k")[1]["ModifyIndex"]
    resp = api.put(f"/v1/kv/{name}/k?cas={modify + 1000}", data=b"stale")
    assert resp.status_code == 200 and resp.json() is False
    assert c.kv.put(f"{name}/k", "v2", cas=modify) is True
    assert c.kv.put(f"{name}/k", "v3", cas=modify) is False
    assert c.kv.get(f"{name}/k")[1]["Value"] == b"v2"


def test_cas_on_missing_key_fails(c, name):
    """?cas=N (N > 0) on a key that does not exist: nothing matches, the answer is false."""
    assert c.kv.put(f"{name}/never", "v", cas=5) is False


def test_put_without_flags_resets_flags(c, name, cleanup):
    """Flags are part of each write (default 0), not sticky."""
    cleanup.prefixes.append(name)
    c.kv.put(f"{name}/f", "v", flags=7)
    c.kv.put(f"{name}/f", "v")
    assert c.kv.get(f"{name}/f")[1]["Flags"] == 0


def test_delete_key_and_recurse(c, api, name, cleanup):
    """Delete Key returns true; ?recurse deletes every key under the prefix."""
    cleanup.prefixes.append(name)
    for key in ("d/1", "d/2", "keep"):
        c.kv.put(f"{name}/{key}", "v")
    resp = api.delete(f"/v1/kv/{name}/keep")
    assert resp.status_code == 200 and resp.json() is True
    assert c.kv.get(f"{name}/keep")[1] is None
    assert c.kv.delete(f"{name}/d", recurse=True) is True
    assert c.kv.get(f"{name}/", recurse=True)[1] is None


def test_delete_cas(c, name, cleanup):
    """Delete ?cas: deletes only when the index matches the ModifyIndex."""
    cleanup.prefixes.append(name)
    c.kv.put(f"{name}/k", "v")
    modify = c.kv.get(f"{name}/k")[1]["ModifyIndex"]
    assert c.kv.delete(f"{name}/k", cas=modify + 1000) is False
    assert c.kv.get(f"{name}/k")[1] is not None
    assert c.kv.delete(f"{name}/k", cas=modify) is True
    assert c.kv.get(f"{name}/k")[1] is None


def test_delete_moves_prefix_index(c, api, name, cleanup):
    """Deleting a key moves the index of a read of its prefix (Consul keeps tombstones for this)."""
    cleanup.prefixes.append(name)
    c.kv.put(f"{name}/w/1", "v")
    c.kv.put(f"{name}/w/2", "v")
    before = int(api.get(f"/v1/kv/{name}/w/?recurse").headers["X-Consul-Index"])
    c.kv.delete(f"{name}/w/2")
    after = int(api.get(f"/v1/kv/{name}/w/?recurse").headers["X-Consul-Index"])
    assert after > before


def test_conflicting_flags_are_400(api, name):
    """kvs_endpoint.go: ?cas with ?acquire/?release, or DELETE ?recurse with ?cas, is "Conflicting flags"."""
    resp = api.delete(f"/v1/kv/{name}/x?recurse&cas=1")
    assert resp.status_code == 400
    assert "Conflicting flags" in resp.text


def test_missing_key_name_is_400(api):
    """kvs_endpoint.go KVSPut: an empty key is 400 "Missing key name"."""
    assert api.put("/v1/kv/", data=b"x").status_code == 400


def test_value_over_512kb_is_413(api, name):
    """KV page: "Values in the KV store cannot be larger than 512kb"; Consul answers 413."""
    resp = api.put(f"/v1/kv/{name}/big", data=b"x" * (512 * 1024 + 1))
    assert resp.status_code == 413


def test_cas_race_has_exactly_one_winner_per_round(consul_addr, name, cleanup):
    """Check-and-set: of 8 writers racing with the same ModifyIndex, exactly one succeeds each round."""
    cleanup.prefixes.append(name)
    key = f"{name}/race"
    clients = [_client(consul_addr) for _ in range(8)]
    clients[0].kv.put(key, "0")
    for round_no in range(10):
        modify = clients[0].kv.get(key)[1]["ModifyIndex"]
        barrier = threading.Barrier(8)
        results: list[bool] = []
        lock = threading.Lock()

        def race(i: int, modify=modify, barrier=barrier, results=results, lock=lock, round_no=round_no) -> None:
            barrier.wait()
            ok = clients[i].kv.put(key, f"{round_no}:{i}", cas=modify)
            with lock:
                results.append(ok)

        threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert sorted(results) == [False] * 7 + [True], f"round {round_no}: {results}"


def test_kv_store_size_is_capped():
    with DevConsulServer(addr="127.0.0.1:0", max_kv_bytes=1000, max_kv_keys=3) as server:
        base = f"http://{server.address}"
        assert requests.put(f"{base}/v1/kv/a", data=b"x" * 900, timeout=5).json() is True
        resp = requests.put(f"{base}/v1/kv/b", data=b"x" * 200, timeout=5)
        assert resp.status_code == 413 and "KV store full" in resp.text
        assert requests.get(f"{base}/v1/kv/b", timeout=5).status_code == 404
        assert requests.put(f"{base}/v1/kv/a", data=b"y", timeout=5).json() is True  # shrinking is fine
        for key in ("b", "c"):
            assert requests.put(f"{base}/v1/kv/{key}", data=b"1", timeout=5).json() is True
        assert requests.put(f"{base}/v1/kv/d", data=b"1", timeout=5).status_code == 413
