"""Who may announce to this agent: the edges' Ed25519 public keys (eas_wire/signing.py) and the nonces of
the batches already heard (a replayed batch is refused).

The agent holds only these public keys (the eas_agent role writes them from the inventory's
``eas_edge_public_keys``): a compromised node can read them and check batches, never make one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from eas_wire.announce import SENT_TOLERANCE_S
from eas_wire.signing import SignatureError, header_key_id, parse_public_keys, verify

# nonces remembered per agent: 2 x SENT_TOLERANCE_S of batches; 16 edges x 100 batches/s x 10 s is 16,000
MAX_NONCES = 65_536


class EdgeKeys:
    def __init__(self, keys: dict, tolerance_s: float = SENT_TOLERANCE_S):
        self.keys, self.tolerance_s = keys, tolerance_s
        self.lock = threading.Lock()
        self.seen: OrderedDict[tuple[str, str], float] = OrderedDict()  # (key, nonce) -> its ts; oldest first

    @classmethod
    def from_file(cls, path: str | Path) -> EdgeKeys:
        """The keys in ``path`` (ValueError naming the file and line; OSError when unreadable)."""
        try:
            keys = parse_public_keys(Path(path).read_text())
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        if not keys:
            raise ValueError(f"{path}: holds no edge public key")
        return cls(keys)

    def known(self, header: str | None) -> bool:
        """The header names a key this agent holds (checked before the body is read)."""
        return header_key_id(header) in self.keys

    def check(self, header: str | None, body: bytes, now: float) -> str:
        """The key id that signed ``body``; raises :class:`~eas_wire.signing.SignatureError` when none of
        this agent's keys did, the signature is stale, or its (key, nonce) was heard already."""
        kid, nonce, ts = verify(self.keys, header, body, now, self.tolerance_s)
        with self.lock:
            while self.seen and next(iter(self.seen.values())) < now - 2 * self.tolerance_s:
                self.seen.popitem(last=False)
            if (kid, nonce) in self.seen:
                raise SignatureError(f"replayed batch (key {kid}, nonce {nonce})")
            if len(self.seen) >= MAX_NONCES:  # a nonce forgotten early could be replayed: refuse instead
                raise SignatureError("too many batches within the replay window")
            self.seen[(kid, nonce)] = max(ts, now)
        return kid
