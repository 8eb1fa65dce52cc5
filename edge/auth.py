"""Client authentication at the edge: OpenAI-style ``Authorization: Bearer <key>``, one or more keys per tenant.

The keys file (``auth.keys_file``, mode 0600) holds one line per key, ``<tenant> sha256:<64 hex>``, the
SHA-256 of the key; ``#`` starts a comment. The edge never holds a client's key, only its hash. Keys are
256-bit random strings (``python -m edge.auth new TENANT`` draws one and prints the file's line), so a
plain SHA-256 is a one-way function no guessing can invert: NIST SP 800-63B section 5.1.2.2 asks for an
approved one-way hash for look-up secrets of at least 112 bits of entropy, and keeps slow, salted key
derivation functions for secrets people choose (which a fast hash would let an attacker guess offline).

Every ``/v1/*`` request is checked before its body is read: the presented key's hash is compared with
every stored hash in constant time (:func:`hmac.compare_digest`, no early exit), and a missing, malformed
or unknown key is a 401 in OpenAI's shape (``authentication_error``, code ``invalid_api_key``), counted by
reason in ``eas_edge_auth_failures_total``. The key is never logged. An accepted request is counted per
tenant in ``eas_edge_tenant_requests_total``. ``/healthz`` stays open (load balancers probe it).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from eas_wire.private_file import read_private_text
from edge.errors import error_response

TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
HASH_PREFIX = "sha256:"
PROTECTED_PREFIX = "/v1/"
FAILURE_REASONS = ("missing", "malformed", "unknown")


class KeysFileError(Exception):
    """The keys file cannot be used; the message names the file and the line, never a key."""


def hash_key(key: str) -> str:
    return HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A client key: 256 random bits, URL-safe (what OpenAI clients accept as ``api_key``)."""
    return "sk-eas-" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class KeyTable:
    """(tenant, digest) per stored key."""

    entries: tuple[tuple[str, bytes], ...]

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(tenant for tenant, _ in self.entries)

    def tenant_of(self, key: str) -> str | None:
        """The tenant whose key ``key`` is; every entry is compared, so the time does not tell which matched."""
        digest = hashlib.sha256(key.encode()).digest()
        found = None
        for tenant, stored in self.entries:
            if hmac.compare_digest(digest, stored) and found is None:
                found = tenant
        return found


def read_keys_file(path: str | Path) -> KeyTable:
    path = Path(path)
    text = read_private_text(path, "the API keys file", error=KeysFileError)
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2 or not TENANT_RE.match(fields[0]) or not _is_hash(fields[1]):
            raise KeysFileError(f"{path}:{number}: expected '<tenant> sha256:<64 hex digits>' (tenant: letters, "
                                "digits, '_', '.', '-'; up to 64)")
        entries.append((fields[0], bytes.fromhex(fields[1][len(HASH_PREFIX):])))
    if not entries:
        raise KeysFileError(f"{path}: no keys (auth: none turns authentication off deliberately)")
    return KeyTable(tuple(entries))


def _is_hash(text: str) -> bool:
    return text.startswith(HASH_PREFIX) and re.fullmatch(r"[0-9a-f]{64}", text[len(HASH_PREFIX):]) is not None


def bearer_key(header: str | None) -> tuple[str | None, str | None]:
    """(key, None) or (None, failure reason) for an ``Authorization`` header."""
    if header is None or not header.strip():
        return None, "missing"
    scheme, _, key = header.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key or any(c.isspace() for c in key):
        return None, "malformed"
    return key, None


class Authenticator:
    """The aiohttp middleware checking ``/v1/*`` requests against a :class:`KeyTable` (None: no check)."""

    def __init__(self, table: KeyTable | None, registry: CollectorRegistry):
        self.table = table
        self.failures = Counter("eas_edge_auth_failures", "Requests refused 401 before their body was read, by "
                                "reason (missing, malformed, unknown key).", ["reason"], registry=registry)
        self.tenant_requests = Counter("eas_edge_tenant_requests", "Authenticated requests answered, by tenant "
                                       "and HTTP status.", ["tenant", "code"], registry=registry)
        for reason in FAILURE_REASONS:
            self.failures.labels(reason)

    def refuse(self, reason: str) -> web.Response:
        self.failures.labels(reason).inc()
        message = {"missing": "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
                   "malformed": "Malformed Authorization header: expected 'Bearer <key>'.",
                   "unknown": "Incorrect API key provided."}[reason]
        return error_response(401, message, "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        if self.table is None or not request.path.startswith(PROTECTED_PREFIX):
            return await handler(request)
        key, reason = bearer_key(request.headers.get("Authorization"))
        tenant = self.table.tenant_of(key) if key is not None else None
        if tenant is None:
            return self.refuse(reason or "unknown")
        response = await handler(request)
        self.tenant_requests.labels(tenant, str(response.status)).inc()
        return response


def main(argv: list[str] | None = None) -> int:
    """``python -m edge.auth new TENANT``: print a new key and the keys file's line for it."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "new" or not TENANT_RE.match(argv[1]):
        print("usage: python -m edge.auth new TENANT   (prints a new key and its keys-file line)", file=sys.stderr)
        return 2
    key = new_key()
    print(f"key (give it to the tenant; it is not stored): {key}")
    print(f"keys file line: {argv[1]} {hash_key(key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
