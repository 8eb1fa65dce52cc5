"""Review M1, M2, M3, L1, L2 (the security review's findings, tests/faults/README.md): the dev server bounds what a client
can make it read, hold and keep, and never applies a write it could not make durable."""

from __future__ import annotations

import errno
import json
import socket
import time

import pytest
import requests

from devconsul import persist
from devconsul.http_server import MAX_BODY
from devconsul.server import DevConsulServer

TOKEN = "c0ffee00-0000-4000-8000-000000000001"


@pytest.fixture
def dev():
    with DevConsulServer(addr="127.0.0.1:0", node_name="n1") as server:
        yield server


@pytest.fixture
def dev_acl():
    with DevConsulServer(addr="127.0.0.1:0", node_name="n1", acl_token=TOKEN) as server:
        yield server


def raw(address: str, head: bytes, body: bytes = b"", timeout: float = 5.0) -> tuple[int, bytes, float]:
    """Send ``head`` (and ``body``) on a new connection; (status, response bytes, seconds to answer)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        started = time.monotonic()
        sock.sendall(head)
        if body:
            try:
                sock.sendall(body)
            except OSError:
                pass
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        took = time.monotonic() - started
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status, data, took


@pytest.mark.parametrize("length", [b"-1", b"abc", b"+5", b" "])
def test_content_length_that_is_not_a_number_is_400(dev, length):
    """Before: -1 read the body to EOF (12 MiB buffered before the 413)."""
    status, data, _ = raw(dev.address, b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n")
    assert status == 400 and b"Connection: close" in data


def test_chunked_body_is_capped_while_reading(dev):
    chunk = b"%x\r\n" % (1 << 20) + b"x" * (1 << 20) + b"\r\n"
    head = b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    status, data, _ = raw(dev.address, head, chunk * (MAX_BODY // (1 << 20) + 1))
    assert status == 413
    assert requests.get(f"http://{dev.address}/v1/kv/k", timeout=5).status_code == 404


def test_negative_chunk_size_is_400(dev):
    head = b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n"
    assert raw(dev.address, head)[0] == 400


def test_content_length_and_chunked_together_is_400(dev):
    head = b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert raw(dev.address, head)[0] == 400


def test_acl_is_decided_before_the_body_is_read(dev_acl):
    """No token and a 12 MiB Content-Length, body never sent: answered 403 at once (before: after the body)."""
    head = b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nContent-Length: 12582912\r\n\r\n"
    status, data, took = raw(dev_acl.address, head, timeout=3)
    assert status == 403 and took < 1.0 and b"Connection: close" in data


def test_idle_connection_is_closed_after_the_timeout():
    with DevConsulServer(addr="127.0.0.1:0", connection_timeout_s=0.3) as server:
        host, port = server.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"GET /v1/status/leader HTTP/1.1\r\n")  # headers never finished
            started = time.monotonic()
            assert sock.recv(1024) == b""  # closed by the server (before: held open forever)
            assert time.monotonic() - started < 3


def test_connections_are_capped():
    with DevConsulServer(addr="127.0.0.1:0", max_connections=4) as server:
        host, port = server.address.rsplit(":", 1)
        held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(4)]
        try:
            time.sleep(0.2)
            status, data, _ = raw(server.address, b"GET /v1/status/leader HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 503 and b"too many connections" in data
            # "All API responses ... will include ... X-Consul-Default-ACL-Policy" (api-structure page)
            assert b"\r\nx-consul-default-acl-policy: allow\r\n" in data.lower()
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # slots come back when the holders go away
            if requests.get(f"http://{server.address}/v1/status/leader", timeout=5).status_code == 200:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("slots never released")


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


def test_read_cache_ignores_unknown_parameters_and_is_byte_capped(dev):
    base = f"http://{dev.address}"
    for i in range(20):
        requests.put(f"{base}/v1/kv/big/{i}", data=b"v" * 100_000, timeout=5)
    for n in range(40):  # review M3: ?junk=N made one 2.7 MB cache entry per request
        assert requests.get(f"{base}/v1/kv/big?recurse&junk={n}", timeout=5).status_code == 200
    assert len(dev.read_cache._entries) <= 2
    dev.read_cache.max_bytes = 3_000_000
    for n in range(3):
        requests.get(f"{base}/v1/kv/big?recurse&keys={n}", timeout=5)
        requests.get(f"{base}/v1/kv/big/?recurse&raw={n}", timeout=5)
    assert dev.read_cache.bytes <= 3_000_000


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


def test_txn_that_fails_leaves_the_store_as_it_was(dev):
    base = f"http://{dev.address}"
    requests.put(f"{base}/v1/kv/t/a", data=b"1", timeout=5)
    ops = [
        {"KV": {"Verb": "set", "Key": "t/b", "Value": "Mg=="}},
        {"KV": {"Verb": "delete", "Key": "t/a"}},
        {"KV": {"Verb": "check-not-exists", "Key": "t/b"}},
    ]
    assert requests.put(f"{base}/v1/txn", data=json.dumps(ops), timeout=5).status_code == 409
    keys = requests.get(f"{base}/v1/kv/t/?keys", timeout=5).json()
    assert keys == ["t/a"]


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
    """Review L1: on a full disk a PUT answered 500 and was still applied; a retry with ?cas=0 said false."""
    full = switchable_disk(monkeypatch)
    with DevConsulServer(addr="127.0.0.1:0", data_dir=tmp_path / "data") as server:
        base = f"http://{server.address}"
        assert requests.put(f"{base}/v1/kv/keep", data=b"1", timeout=5).json() is True
        full["on"] = True
        started = time.monotonic()
        resp = requests.put(f"{base}/v1/kv/fill", data=b"x" * 60_000, timeout=15)
        assert resp.status_code == 500 and "not applied" in resp.text
        assert time.monotonic() - started < 5  # before: 10 s
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
    # stop() with the disk still full: one log line, no exception out of stop


def _recovered(base: str, full: dict) -> None:
    """Free the disk and wait until the persister has written the state again (it retries every second)."""
    full["on"] = False
    deadline = time.monotonic() + 5
    while requests.put(f"{base}/v1/kv/probe", data=b"1", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the persister never recovered"
        time.sleep(0.2)


def test_catalog_write_that_cannot_be_made_durable_is_not_applied(tmp_path, monkeypatch):
    """Before: a catalog write on a full disk was answered 500 "not durable" and stayed applied in memory
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
    assert "Output:" not in check["Output"]  # nothing was fetched (before: the data: URL's "hello")


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
    assert calls["n"] >= 2  # before: the TypeError ended the probe thread for good


def test_allow_remote_requires_acls():
    """Review L3: --allow-remote without --acl-token-file served everything to anyone (refused before binding)."""
    from click.testing import CliRunner

    from cli.commands.dev import command
    from common.errors import UsageError

    result = CliRunner().invoke(command, ["consul", "--addr", "0.0.0.0:8500", "--allow-remote"])
    assert isinstance(result.exception, UsageError) and "--acl-token-file" in str(result.exception)


def test_kv_snapshot_encodes_each_value_once(monkeypatch):
    """The persister snapshots the store under the state lock; to_record base64-encoded every value
    twice (once in to_api, again over it). Same records, half the work."""
    import base64

    from devconsul import kvstore
    from devconsul.state import State

    store = kvstore.KVStore(State())
    for n, value in enumerate((b"one", b"", b"\x00\xff" * 100)):
        store.set(f"k/{n}", value, flags=n)
    encoded = []
    real = base64.b64encode
    monkeypatch.setattr(kvstore.base64, "b64encode", lambda data: encoded.append(data) or real(data))
    snap = store.snapshot()
    assert len(encoded) == 2  # the two non-empty values, once each (before: 4)
    assert [(r["Key"], r["Value"], r["Flags"]) for r in snap["entries"]] == [
        ("k/0", "b25l", 0), ("k/1", None, 1), ("k/2", base64.b64encode(b"\x00\xff" * 100).decode(), 2)]
    again = kvstore.KVStore(State())
    again.restore(snap)
    assert [again.get(f"k/{n}")[1].value for n in range(3)] == [b"one", None, b"\x00\xff" * 100]
