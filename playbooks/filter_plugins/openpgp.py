"""``key_text | openpgp_fingerprints``: the fingerprints of the primary keys in an OpenPGP public key (ASCII
armored, as apt repositories publish them at ``<repo>/gpg``), upper-case hex without spaces, in order.

For the consul_agent role's pin of HashiCorp's repository key (unpinned, the key would come from the
repository's own host and nothing would check it): the role fetches the key, and installs it only when one of
these fingerprints is pinned in ``consul_agent_repo_key_fingerprints``.

RFC 4880 (section 4.2: packet headers, old and new format; 6.2: ASCII armor; 12.2: a v4 key's fingerprint is
the SHA-1 of 0x99, the two-byte length of the public-key packet body, and that body) and RFC 9580 (section
5.5.4: a v6 key's is the SHA-256 of 0x9B, a four-byte length and the body). Only primary keys (tag 6) count:
subkeys (tag 14) are what a key signs with, the primary is what a person pins.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from ansible.errors import AnsibleFilterError

PUBLIC_KEY_TAG = 6
_ARMOR_BEGIN = "-----BEGIN PGP PUBLIC KEY BLOCK-----"
_ARMOR_END = "-----END PGP PUBLIC KEY BLOCK-----"


class KeyFormatError(AnsibleFilterError):
    pass


def _dearmor(text: str) -> bytes:
    lines = [line.strip() for line in text.strip().splitlines()]
    if _ARMOR_BEGIN not in lines or _ARMOR_END not in lines:
        raise KeyFormatError(f"openpgp_fingerprints: not an ASCII-armored public key block (no {_ARMOR_BEGIN!r} ... "
                        f"{_ARMOR_END!r}); first line: {lines[0][:80] if lines else ''!r}")
    body = lines[lines.index(_ARMOR_BEGIN) + 1:lines.index(_ARMOR_END)]
    if "" in body:  # armor headers ("Version: ...", "Comment: ...") end at the first blank line
        body = body[body.index("") + 1:]
    data = "".join(line for line in body if not line.startswith("="))  # "=XXXX" is the CRC-24 line
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyFormatError(f"openpgp_fingerprints: the armored block is not base64 ({exc})") from None


def _packets(data: bytes):
    """(tag, body) of each packet; a truncated or indefinite-length packet is an error, not a guess."""
    at = 0
    while at < len(data):
        first = data[at]
        if not first & 0x80:
            raise KeyFormatError(f"openpgp_fingerprints: byte {at} is not a packet header (0x{first:02x})")
        if first & 0x40:  # new format: tag in the low six bits, then a one-, two- or five-byte length
            tag, at = first & 0x3F, at + 1
            if at >= len(data):
                raise KeyFormatError("openpgp_fingerprints: truncated packet header")
            octet = data[at]
            if octet < 192:
                length, at = octet, at + 1
            elif octet < 224:
                if at + 1 >= len(data):
                    raise KeyFormatError("openpgp_fingerprints: truncated packet header")
                length, at = ((octet - 192) << 8) + data[at + 1] + 192, at + 2
            elif octet == 255:
                length, at = int.from_bytes(data[at + 1:at + 5], "big"), at + 5
            else:
                raise KeyFormatError("openpgp_fingerprints: partial-length packets do not occur in a public key")
        else:  # old format: tag in bits 5-2, length type in bits 1-0
            tag, kind, at = (first >> 2) & 0x0F, first & 0x03, at + 1
            if kind == 3:
                raise KeyFormatError("openpgp_fingerprints: indefinite-length packets do not occur in a public key")
            size = (1, 2, 4)[kind]
            length, at = int.from_bytes(data[at:at + size], "big"), at + size
        if at + length > len(data):
            raise KeyFormatError(f"openpgp_fingerprints: a packet of {length} bytes runs past the end of the key")
        yield tag, data[at:at + length]
        at += length


def fingerprint(body: bytes) -> str:
    """The fingerprint of one public-key packet body (v4: SHA-1; v6: SHA-256)."""
    version = body[0] if body else None
    if version == 4:
        return hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper()  # noqa: S324 (RFC 4880's)
    if version == 6:
        return hashlib.sha256(b"\x9b" + len(body).to_bytes(4, "big") + body).hexdigest().upper()
    raise KeyFormatError(f"openpgp_fingerprints: key version {version} is not supported (v4 and v6 are)")


def openpgp_fingerprints(text: Any) -> list[str]:
    found = [fingerprint(body) for tag, body in _packets(_dearmor(str(text or ""))) if tag == PUBLIC_KEY_TAG]
    if not found:
        raise KeyFormatError("openpgp_fingerprints: the block holds no public key")
    return found


def normalized_fingerprint(value: Any) -> str:
    """``"798A EC65 ..."`` -> ``"798AEC65..."``: how gpg prints one and how this module compares them."""
    return "".join(str(value or "").split()).upper()


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"openpgp_fingerprints": openpgp_fingerprints, "normalized_fingerprint": normalized_fingerprint}
