"""The dev server's KV store (devconsul/kvstore.py): the persister's snapshot encodes each value once."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


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
    assert len(encoded) == 2  # the two non-empty values, once each (not: 4)
    assert [(r["Key"], r["Value"], r["Flags"]) for r in snap["entries"]] == [
        ("k/0", "b25l", 0), ("k/1", None, 1), ("k/2", base64.b64encode(b"\x00\xff" * 100).decode(), 2)]
    again = kvstore.KVStore(State())
    again.restore(snap)
    assert [again.get(f"k/{n}")[1].value for n in range(3)] == [b"one", None, b"\x00\xff" * 100]
