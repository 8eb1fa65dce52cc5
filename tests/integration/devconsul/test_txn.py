"""Transactions: https://developer.hashicorp.com/consul/api-docs/txn (Create Transaction, KV ops)."""

from __future__ import annotations

import base64
import json

import pytest
import requests

pytestmark = pytest.mark.integration


def _kv(verb: str, key: str, value: bytes | None = None, index: int | None = None) -> dict:
    op: dict = {"Verb": verb, "Key": key}
    if value is not None:
        op["Value"] = base64.b64encode(value).decode()
    if index is not None:
        op["Index"] = index
    return {"KV": op}


def test_txn_applies_all_under_one_index(api, name, cleanup):
    """"If any operation fails, the transaction is rolled back"; successful writes share one index
    (one Raft entry); write results come back without their values."""
    cleanup.prefixes.append(name)
    resp = api.put("/v1/txn", json=[_kv("set", f"{name}/a", b"1"), _kv("set", f"{name}/b", b"2")])
    assert resp.status_code == 200
    body = resp.json()
    assert body["Errors"] is None
    results = [r["KV"] for r in body["Results"]]
    assert [r["Key"] for r in results] == [f"{name}/a", f"{name}/b"]
    assert all(r["Value"] is None for r in results)
    assert results[0]["ModifyIndex"] == results[1]["ModifyIndex"]


def test_txn_failure_rolls_back_with_409(c, api, name, cleanup):
    """A failing op (cas with a stale index) makes the whole transaction fail with 409 and Errors
    naming the OpIndex; the earlier set in the same transaction is not applied."""
    cleanup.prefixes.append(name)
    c.kv.put(f"{name}/existing", "v")
    modify = c.kv.get(f"{name}/existing")[1]["ModifyIndex"]
    resp = api.put("/v1/txn", json=[
        _kv("set", f"{name}/new", b"x"),
        _kv("cas", f"{name}/existing", b"y", index=modify + 1000),
    ])
    assert resp.status_code == 409
    body = resp.json()
    assert body["Errors"][0]["OpIndex"] == 1
    assert c.kv.get(f"{name}/new")[1] is None
    assert c.kv.get(f"{name}/existing")[1]["Value"] == b"v"


def test_txn_get_returns_value(c, api, name, cleanup):
    """A "get" op returns the entry with its Value (base64)."""
    cleanup.prefixes.append(name)
    c.kv.put(f"{name}/g", "hello")
    resp = api.put("/v1/txn", json=[_kv("get", f"{name}/g")])
    assert resp.status_code == 200
    assert base64.b64decode(resp.json()["Results"][0]["KV"]["Value"]) == b"hello"


def test_txn_too_many_ops_is_413(api, name):
    """"up to a limit of 64" operations; Consul answers 413 beyond it."""
    ops = [_kv("set", f"{name}/{i}", b"v") for i in range(65)]
    assert api.put("/v1/txn", json=ops).status_code == 413


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
