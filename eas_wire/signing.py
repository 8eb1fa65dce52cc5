"""Signed announce batches: each edge holds an Ed25519 private key, every node agent holds only the edges'
public keys (the contract: docs/contracts/announce.md, "Authentication").

Threat: GPU nodes run third-party model code, so a node is a possible attacker. A shared secret on every node
would let one compromised node create announcements for every other node's IUs; a public key lets it only
check them. The edge id names its key (``<name>.<key id>.<nonce>``, :func:`edge_key_id`), so a batch can
only speak for ids of the key that signed it: a claimed id of another edge is refused, never counted.

    X-Eas-Signature: key=<16 hex>,ts=<seconds since the epoch>,nonce=<16 hex>,sig=<base64url>

The signature covers :data:`DOMAIN`, ``ts``, ``nonce`` and the exact body bytes; an agent refuses a ``ts``
further than :data:`~eas_wire.announce.SENT_TOLERANCE_S` from its clock and a (key, nonce) it has seen
within that window (a replayed batch).

Key text: a public key is the base64 of its 32 raw bytes (one word; a keys file has one per line, a comment
after it allowed); a private key file holds the base64 of the 32-byte seed (one word, mode 0600).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import re
import secrets

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIGNATURE_HEADER = "X-Eas-Signature"
DOMAIN = b"eas-announce-v1\n"  # a signature for this channel is never valid for another message kind
KEY_ID_HEX = 16
NONCE_HEX = 16
_HEADER = re.compile(r"key=([0-9a-f]{16}),ts=([0-9]{1,12}(?:\.[0-9]{1,6})?),nonce=([0-9a-f]{16}),"
                     r"sig=([A-Za-z0-9_-]{86})")
_RAW = serialization.Encoding.Raw


class SignatureError(ValueError):
    """The batch's signature is missing, malformed, stale, replayed or wrong; the message says which."""


def public_text(key: Ed25519PublicKey) -> str:
    return base64.b64encode(key.public_bytes(_RAW, serialization.PublicFormat.Raw)).decode()


def private_text(key: Ed25519PrivateKey) -> str:
    raw = key.private_bytes(_RAW, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    return base64.b64encode(raw).decode()


def generate_key_pair() -> tuple[str, str]:
    """(private key text, public key text) of a new edge key."""
    key = Ed25519PrivateKey.generate()
    return private_text(key), public_text(key.public_key())


def _raw32(text: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not base64") from None
    if len(raw) != 32:
        raise ValueError(f"{what} is {len(raw)} bytes, not 32")
    return raw


def load_private(text: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(_raw32(text, "the edge's private key"))


def load_public(text: str) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(_raw32(text, "an edge public key"))


def key_id(key: Ed25519PublicKey) -> str:
    """The first :data:`KEY_ID_HEX` hex digits of the SHA-256 of the raw public key."""
    return hashlib.sha256(key.public_bytes(_RAW, serialization.PublicFormat.Raw)).hexdigest()[:KEY_ID_HEX]


def parse_public_keys(text: str) -> dict[str, Ed25519PublicKey]:
    """The keys of a public keys file (one base64 key a line, then an optional comment; ``#`` lines and
    blank lines skipped), by key id. Raises ValueError naming the line."""
    keys = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        try:
            key = load_public(words[0])
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
        keys[key_id(key)] = key
    return keys


def edge_key_id(edge: str) -> str | None:
    """The key id an edge id names (``<name>.<key id>.<nonce>``), or None when it names none."""
    parts = edge.split(".")
    if len(parts) >= 3 and re.fullmatch(r"[0-9a-f]{16}", parts[-2]):
        return parts[-2]
    return None


def request_message(method: str, target: str) -> bytes:
    """What an edge signs to make a bodiless request (its ``/scores`` stream) as itself: the request line's
    method and target; the agent serves a signed stream from the slots reserved for edges."""
    return f"{method} {target}".encode()


def _message(ts: str, nonce: str, body: bytes) -> bytes:
    return DOMAIN + ts.encode() + b"\n" + nonce.encode() + b"\n" + body


def sign(key: Ed25519PrivateKey, body: bytes, now: float, nonce: str | None = None) -> str:
    """The :data:`SIGNATURE_HEADER` value for ``body`` sent at ``now``."""
    ts, nonce = f"{now:.6f}", nonce if nonce is not None else secrets.token_hex(NONCE_HEX // 2)
    sig = base64.urlsafe_b64encode(key.sign(_message(ts, nonce, body))).decode().rstrip("=")
    return f"key={key_id(key.public_key())},ts={ts},nonce={nonce},sig={sig}"


def header_key_id(header: str | None) -> str | None:
    """The key id a signature header names (None: no header, or not one): checked before the body is read."""
    match = _HEADER.fullmatch((header or "").strip())
    return match.group(1) if match else None


def verify(keys: dict[str, Ed25519PublicKey], header: str | None, body: bytes, now: float,
           tolerance_s: float) -> tuple[str, str, float]:
    """(key id, nonce, ts) of a signature by one of ``keys`` over ``body`` made within ``tolerance_s`` of
    ``now``; raises :class:`SignatureError`. Replays within the window are the caller's to refuse (it keeps
    the nonces it has seen)."""
    match = _HEADER.fullmatch((header or "").strip())
    if match is None:
        raise SignatureError(f"missing or malformed {SIGNATURE_HEADER} header")
    kid, ts, nonce, sig = match.groups()
    key = keys.get(kid)
    if key is None:
        raise SignatureError(f"key {kid} is not one of this agent's edge keys")
    when = float(ts)
    if not math.isfinite(when) or abs(when - now) > tolerance_s:
        raise SignatureError(f"signature time {ts} is more than {tolerance_s:g} s from the agent's clock")
    try:
        key.verify(base64.urlsafe_b64decode(sig + "=="), _message(ts, nonce, body))
    except (InvalidSignature, binascii.Error, ValueError):
        raise SignatureError(f"signature does not verify with key {kid}") from None
    return kid, nonce, when
