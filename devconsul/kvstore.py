"""The KV store, with Consul's index rules (https://developer.hashicorp.com/consul/api-docs/kv).

- A single-key read reports the entry's ModifyIndex, or the KV table index when the key is missing.
- A prefix read (``?recurse`` / ``?keys``) reports the highest ModifyIndex under the prefix, counting
  deleted keys (Consul keeps tombstones so a delete moves the index of a watched prefix), and falls back
  to the table index when nothing under the prefix was ever written; the empty prefix uses the table
  index.
- ``cas=0`` writes only when the key does not exist; ``cas=N`` only when the ModifyIndex is N.
"""

from __future__ import annotations

import base64
import bisect
from dataclasses import dataclass

from devconsul.state import State

MAX_VALUE_SIZE = 512 * 1024  # Consul's default kv_max_value_size


@dataclass
class KVEntry:
    key: str
    value: bytes | None
    flags: int
    create_index: int
    modify_index: int
    lock_index: int = 0

    def to_api(self, with_value: bool = True) -> dict:
        value = base64.b64encode(self.value).decode() if (with_value and self.value) else None
        return {
            "LockIndex": self.lock_index,
            "Key": self.key,
            "Flags": self.flags,
            "Value": value,
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }

    def to_record(self) -> dict:
        return {**self.to_api(), "Value": base64.b64encode(self.value).decode() if self.value else None}

    @classmethod
    def from_record(cls, rec: dict) -> KVEntry:
        value = base64.b64decode(rec["Value"]) if rec.get("Value") else None
        return cls(rec["Key"], value, rec["Flags"], rec["CreateIndex"], rec["ModifyIndex"], rec["LockIndex"])


class KVStore:
    def __init__(self, state: State):
        self.state = state
        self._entries: dict[str, KVEntry] = {}
        self._sorted: list[str] = []
        self._tombstones: dict[str, int] = {}
        self._tomb_sorted: list[str] = []
        self.table_index = 0
        # prefix -> (table_index when computed, prefix index): the watchers one write wakes all ask
        # for the same prefix's index; it can only change when the table index does.
        self._index_memo: dict[str, tuple[int, int]] = {}

    # -- reads (callers hold state.lock) --------------------------------------------------------
    def get(self, key: str) -> tuple[int, KVEntry | None]:
        entry = self._entries.get(key)
        if entry is not None:
            return entry.modify_index, entry
        return max(self.table_index, 1), None

    def list(self, prefix: str) -> tuple[int, list[KVEntry]]:
        entries = [self._entries[k] for k in self._prefix_keys(prefix)]
        return self._prefix_index(prefix, entries), entries

    def prefix_index(self, prefix: str) -> int:
        """The index a ``?recurse`` or ``?keys`` read of ``prefix`` reports."""
        memo = self._index_memo.get(prefix)
        if memo is not None and memo[0] == self.table_index:
            return memo[1]
        index = self._prefix_index(prefix, [self._entries[k] for k in self._prefix_keys(prefix)])
        if len(self._index_memo) > 1024:
            self._index_memo.clear()
        self._index_memo[prefix] = (self.table_index, index)
        return index

    def keys(self, prefix: str, separator: str) -> tuple[int, list[str]]:
        entries = [self._entries[k] for k in self._prefix_keys(prefix)]
        keys: list[str] = []
        for entry in entries:
            key = entry.key
            if separator:
                cut = key.find(separator, len(prefix))
                if cut >= 0:
                    key = key[: cut + len(separator)]
            if not keys or keys[-1] != key:
                keys.append(key)
        return self._prefix_index(prefix, entries), keys

    def _prefix_keys(self, prefix: str, keys: list[str] | None = None) -> list[str]:
        keys = self._sorted if keys is None else keys
        start = bisect.bisect_left(keys, prefix)
        end = start
        while end < len(keys) and keys[end].startswith(prefix):
            end += 1
        return keys[start:end]

    def _prefix_index(self, prefix: str, entries: list[KVEntry]) -> int:
        if not prefix:
            return max(self.table_index, 1)
        index = max((e.modify_index for e in entries), default=0)
        for key in self._prefix_keys(prefix, self._tomb_sorted):
            index = max(index, self._tombstones[key])
        return index or max(self.table_index, 1)

    # -- writes (callers hold state.lock) -------------------------------------------------------
    def set(self, key: str, value: bytes | None, flags: int, cas: int | None = None) -> bool:
        current = self._entries.get(key)
        if cas is not None:
            if cas == 0 and current is not None:
                return False
            if cas != 0 and (current is None or current.modify_index != cas):
                return False
        index = self.state.next_index()
        if current is None:
            self._entries[key] = KVEntry(key, value or None, flags, index, index)
            bisect.insort(self._sorted, key)
        else:
            current.value, current.flags, current.modify_index = value or None, flags, index
        self.table_index = index
        return True

    def delete(self, key: str, cas: int | None = None) -> bool:
        current = self._entries.get(key)
        if cas is not None and (current is None or current.modify_index != cas):
            # kvsDeleteCASTxn: a missing key counts as deleted (true), a ModifyIndex mismatch as false
            return current is None
        if current is None:
            return True
        self._remove([key], self.state.next_index())
        return True

    def delete_tree(self, prefix: str) -> list[str]:
        doomed = self._prefix_keys(prefix)
        if doomed:
            self._remove(doomed, self.state.next_index())
        return doomed

    def _remove(self, keys: list[str], index: int) -> None:
        for key in keys:
            del self._entries[key]
            self._sorted.pop(bisect.bisect_left(self._sorted, key))
            if key not in self._tombstones:
                bisect.insort(self._tomb_sorted, key)
            self._tombstones[key] = index
        self.table_index = index

    # -- persistence ----------------------------------------------------------------------------
    def snapshot(self) -> dict:
        return {
            "entries": [e.to_record() for e in self._entries.values()],
            "tombstones": dict(self._tombstones),
            "table_index": self.table_index,
        }

    def restore(self, snap: dict) -> None:
        self._entries = {rec["Key"]: KVEntry.from_record(rec) for rec in snap.get("entries", [])}
        self._sorted = sorted(self._entries)
        self._tombstones = dict(snap.get("tombstones", {}))
        self._tomb_sorted = sorted(self._tombstones)
        self.table_index = snap.get("table_index", 0)
        self._index_memo.clear()
