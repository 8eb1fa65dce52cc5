"""OpenPGP public keys for apt repositories, read on the controller.

``key_text | openpgp_fingerprints``: the fingerprints of the primary keys in an OpenPGP public key (ASCII
armored, as apt repositories publish them at ``<repo>/gpg``), upper-case hex without spaces, in order. For the
consul_agent role's pin of HashiCorp's repository key (unpinned, the key would come from the repository's own
host and nothing would check it): the role fetches the key, and installs it only when one of these
fingerprints is pinned in ``consul_agent_repo_key_fingerprints``.

``key | openpgp_mirror_key(fingerprint, variable)``: the signing key of a site's mirror that re-signs a
vendor's repository (aptly, Pulp, Artifactory publish with the site's own key), given as an ASCII-armored block
or the absolute path of a keyring file on the controller (armored, or binary as ``gpg --export`` writes it).
Returns ``{"armored": ..., "fingerprint": ..., "problem": ...}``: the key re-armored (what the role installs
under /etc/apt/keyrings, the same text whichever form it came in), or ``problem``, one line naming the variable
and both fingerprints, when the key is not exactly the pinned one. Both empty: no mirror key (``armored`` "").

RFC 4880 (section 4.2: packet headers, old and new format; 6.2: ASCII armor; 12.2: a v4 key's fingerprint is
the SHA-1 of 0x99, the two-byte length of the public-key packet body, and that body) and RFC 9580 (section
5.5.4: a v6 key's is the SHA-256 of 0x9B, a four-byte length and the body). Only primary keys (tag 6) count:
subkeys (tag 14) are what a key signs with, the primary is what a person pins.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

PUBLIC_KEY_TAG = 6
SECRET_KEY_TAGS = (5, 7)  # secret key, secret subkey
KEYBOX_MAGIC = b"KBXf"  # bytes 8-11 of a GnuPG keybox (pubring.kbx), which apt cannot read
_ARMOR_BEGIN = "-----BEGIN PGP PUBLIC KEY BLOCK-----"
_ARMOR_END = "-----END PGP PUBLIC KEY BLOCK-----"


class KeyFormatError(AnsibleFilterError):
    pass


def _dearmor(text: str) -> bytes:
    lines = [line.strip() for line in text.strip().splitlines()]
    if _ARMOR_BEGIN not in lines or _ARMOR_END not in lines:
        raise KeyFormatError(f"not an ASCII-armored public key block (no {_ARMOR_BEGIN!r} ... "
                        f"{_ARMOR_END!r}); first line: {lines[0][:80] if lines else ''!r}")
    body = lines[lines.index(_ARMOR_BEGIN) + 1:lines.index(_ARMOR_END)]
    if "" in body:  # armor headers ("Version: ...", "Comment: ...") end at the first blank line
        body = body[body.index("") + 1:]
    data = "".join(line for line in body if not line.startswith("="))  # "=XXXX" is the CRC-24 line
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyFormatError(f"the armored block is not base64 ({exc})") from None


def _packets(data: bytes):
    """(tag, body) of each packet; a truncated or indefinite-length packet is an error, not a guess."""
    at = 0
    while at < len(data):
        first = data[at]
        if not first & 0x80:
            raise KeyFormatError(f"byte {at} is not a packet header (0x{first:02x})")
        if first & 0x40:  # new format: tag in the low six bits, then a one-, two- or five-byte length
            tag, at = first & 0x3F, at + 1
            if at >= len(data):
                raise KeyFormatError("truncated packet header")
            octet = data[at]
            if octet < 192:
                length, at = octet, at + 1
            elif octet < 224:
                if at + 1 >= len(data):
                    raise KeyFormatError("truncated packet header")
                length, at = ((octet - 192) << 8) + data[at + 1] + 192, at + 2
            elif octet == 255:
                length, at = int.from_bytes(data[at + 1:at + 5], "big"), at + 5
            else:
                raise KeyFormatError("partial-length packets do not occur in a public key")
        else:  # old format: tag in bits 5-2, length type in bits 1-0
            tag, kind, at = (first >> 2) & 0x0F, first & 0x03, at + 1
            if kind == 3:
                raise KeyFormatError("indefinite-length packets do not occur in a public key")
            size = (1, 2, 4)[kind]
            length, at = int.from_bytes(data[at:at + size], "big"), at + size
        if at + length > len(data):
            raise KeyFormatError(f"a packet of {length} bytes runs past the end of the key")
        yield tag, data[at:at + length]
        at += length


def fingerprint(body: bytes) -> str:
    """The fingerprint of one public-key packet body (v4: SHA-1; v6: SHA-256)."""
    version = body[0] if body else None
    if version == 4:
        return hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper()  # noqa: S324 (RFC 4880's)
    if version == 6:
        return hashlib.sha256(b"\x9b" + len(body).to_bytes(4, "big") + body).hexdigest().upper()
    raise KeyFormatError(f"key version {version} is not supported (v4 and v6 are)")


def openpgp_fingerprints(text: Any) -> list[str]:
    try:
        return _primary_fingerprints(_dearmor(str(text or "")))
    except KeyFormatError as exc:
        raise KeyFormatError(f"openpgp_fingerprints: {exc}") from None


def _primary_fingerprints(data: bytes) -> list[str]:
    packets = list(_packets(data))
    if any(tag in SECRET_KEY_TAGS for tag, _ in packets):
        raise KeyFormatError("it holds a secret key: give only the public key (`gpg --export`, never "
                             "--export-secret-keys); a keyring under /etc/apt/keyrings is readable by every user")
    found = [fingerprint(body) for tag, body in packets if tag == PUBLIC_KEY_TAG]
    if not found:
        raise KeyFormatError("the block holds no public key")
    return found


def normalized_fingerprint(value: Any) -> str:
    """``"798A EC65 ..."`` -> ``"798AEC65..."``: how gpg prints one and how this module compares them."""
    return "".join(str(value or "").split()).upper()


def armor(data: bytes) -> str:
    """``data`` as an ASCII-armored public key block (RFC 4880 6.2: 64-character base64 lines, then the CRC-24)."""
    body = base64.b64encode(data).decode()
    crc = base64.b64encode(_crc24(data).to_bytes(3, "big")).decode()
    return "\n".join([_ARMOR_BEGIN, "", *(body[at:at + 64] for at in range(0, len(body), 64)), f"={crc}",
                      _ARMOR_END]) + "\n"


def _crc24(data: bytes) -> int:
    """RFC 4880 6.1."""
    crc = 0xB704CE
    for byte in data:
        crc ^= byte << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= 0x1864CFB
    return crc & 0xFFFFFF


def _key_bytes(key: str) -> tuple[bytes, str]:
    """The key's packets and how a message names where they came from."""
    if key.startswith("-----BEGIN "):
        return _dearmor(key), "the armored block"
    if not key.startswith("/"):
        raise KeyFormatError(f"{key.splitlines()[0][:80]!r} is neither an ASCII-armored public key block nor the "
                             "absolute path of a keyring file on the controller")
    try:
        data = Path(key).read_bytes()
    except OSError as exc:
        raise KeyFormatError(f"{key} on the controller cannot be read ({exc.strerror})") from None
    if data[8:12] == KEYBOX_MAGIC:
        raise KeyFormatError(f"{key} is a GnuPG keybox, which apt cannot read: export the key into a file of its "
                             "own (`gpg --export FINGERPRINT > FILE`)")
    if data.lstrip().startswith(b"-----BEGIN "):
        try:
            return _dearmor(data.decode("ascii")), f"{key} on the controller"
        except (UnicodeDecodeError, KeyFormatError) as exc:
            raise KeyFormatError(f"{key}: {exc}") from None
    return data, f"{key} on the controller"


def openpgp_mirror_key(key: Any, pinned: Any, variable: str) -> dict[str, str]:
    key, want, pin_variable = str(key or "").strip(), normalized_fingerprint(pinned), f"{variable}_fingerprint"
    if not key and not want:
        return {"armored": "", "fingerprint": "", "problem": ""}
    if not want:
        problem = (f"{variable} is set but {pin_variable} is empty: set it to the key's fingerprint (`gpg --show-keys "
                   "FILE`); an unchecked key is never installed")
    elif not key:
        problem = (f"{pin_variable} is {want} but {variable} is empty: set the mirror's key (the absolute path of "
                   "a keyring file on the controller, or the armored block), or neither")
    elif not re.fullmatch("[0-9A-F]{40}|[0-9A-F]{64}", want):
        problem = (f"{pin_variable} is {str(pinned)!r}: a fingerprint is 40 hex digits (64 for a v6 key), as "
                   "`gpg --show-keys` prints it; a short or long key id can be forged")
    else:
        try:
            data, source = _key_bytes(key)
            found = _primary_fingerprints(data)
        except KeyFormatError as exc:
            problem = f"{variable}: {exc}"
        else:
            if found == [want]:
                return {"armored": armor(data), "fingerprint": want, "problem": ""}
            holds = f"is the key {found[0]}" if len(found) == 1 else f"holds the keys {', '.join(found)}"
            problem = f"{variable} ({source}) {holds}, not {pin_variable} {want}: not installed"
    return {"armored": "", "fingerprint": want, "problem": problem}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"openpgp_fingerprints": openpgp_fingerprints, "normalized_fingerprint": normalized_fingerprint,
                "openpgp_mirror_key": openpgp_mirror_key}
