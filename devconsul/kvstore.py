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
from dataclasses import dataclass, replace

from devconsul.state import State

MAX_VALUE_SIZE = 512 * 1024  # Consul's default kv_max_value_size
# Consul has no total limit (Raft and the disk are); a dev server on a shared box gets one, so one client
# cannot fill the machine's memory: ``devconsul --max-kv-bytes/--max-kv-keys`` change them.
DEFAULT_MAX_BYTES = 256 * 2**20
DEFAULT_MAX_KEYS = 200_000


class StoreFull(Exception):
    """A write would pass ``max_bytes`` or ``max_keys``; nothing was changed."""


@dataclass
class UndoRecord:
    key: str
    before: KVEntry | None  # a copy of the entry before the write (None: it did not exist)
    tombstone: int | None  # the key's tombstone index before the write
    index: int  # the index the write gave the key


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
        """The persisted form: the API form with its value (each value encoded once, under the lock)."""
        return self.to_api()

    @classmethod
    def from_record(cls, rec: dict) -> KVEntry:
        value = base64.b64decode(rec["Value"]) if rec.get("Value") else None
        return cls(rec["Key"], value, rec["Flags"], rec["CreateIndex"], rec["ModifyIndex"], rec["LockIndex"])


class KVStore:
    def __init__(self, state: State, max_bytes: int = DEFAULT_MAX_BYTES, max_keys: int = DEFAULT_MAX_KEYS):
        self.state = state
        self.max_bytes, self.max_keys = max_bytes, max_keys
        self.bytes = 0  # keys + values held
        self._undo: list[UndoRecord] | None = None
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
        old_size = _size(current)
        new_size = len(key) + len(value or b"")
        if self.bytes - old_size + new_size > self.max_bytes:
            raise StoreFull(f"KV store full: {self.bytes} bytes held, limit {self.max_bytes}")
        if current is None and len(self._entries) >= self.max_keys:
            raise StoreFull(f"KV store full: {len(self._entries)} keys held, limit {self.max_keys}")
        index = self.state.next_index()
        self._remember(key, index)
        if current is None:
            self._entries[key] = KVEntry(key, value or None, flags, index, index)
            bisect.insort(self._sorted, key)
        else:
            current.value, current.flags, current.modify_index = value or None, flags, index
        self.bytes += new_size - old_size
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
            self._remember(key, index)
            self.bytes -= _size(self._entries[key])
            del self._entries[key]
            self._sorted.pop(bisect.bisect_left(self._sorted, key))
            if key not in self._tombstones:
                bisect.insort(self._tomb_sorted, key)
            self._tombstones[key] = index
        self.table_index = index

    # -- undo (a transaction that fails, a write that could not be made durable) -----------------
    def _remember(self, key: str, index: int) -> None:
        if self._undo is not None:
            current = self._entries.get(key)
            before = replace(current) if current is not None else None
            self._undo.append(UndoRecord(key, before, self._tombstones.get(key), index))

    def begin_undo(self) -> list[UndoRecord]:
        """Record every change until :meth:`end_undo`; lock held. Costs one entry copy per written key
        (not a snapshot of the whole store)."""
        self._undo = []
        return self._undo

    def end_undo(self) -> None:
        self._undo = None

    def undoer(self, log: list[UndoRecord]):
        """For ``finish_write``: undo ``log`` (lock held) and return the topics restored."""
        return lambda: [("kv", key) for key in self.rollback(log)]

    def rollback(self, log: list[UndoRecord]) -> list[str]:
        """Undo the recorded writes, newest first, except where a later writer changed the key since (its
        write stands). Returns the keys restored; lock held."""
        restored = []
        for rec in reversed(log):
            current = self._entries.get(rec.key)
            ours = (current is not None and current.modify_index == rec.index) or (
                current is None and self._tombstones.get(rec.key) == rec.index
            )
            if not ours:
                continue
            if current is not None:
                self.bytes -= _size(current)
                del self._entries[rec.key]
                self._sorted.pop(bisect.bisect_left(self._sorted, rec.key))
            if rec.before is not None:
                self._entries[rec.key] = rec.before
                bisect.insort(self._sorted, rec.key)
                self.bytes += _size(rec.before)
            if rec.tombstone is None and rec.key in self._tombstones:
                del self._tombstones[rec.key]
                self._tomb_sorted.pop(bisect.bisect_left(self._tomb_sorted, rec.key))
            elif rec.tombstone is not None:
                if rec.key not in self._tombstones:
                    bisect.insort(self._tomb_sorted, rec.key)
                self._tombstones[rec.key] = rec.tombstone
            restored.append(rec.key)
        self._index_memo.clear()
        return restored

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
        self.bytes = sum(_size(e) for e in self._entries.values())
        self._index_memo.clear()


def _size(entry: KVEntry | None) -> int:
    return 0 if entry is None else len(entry.key) + len(entry.value or b"")
