"""A copy of inventory/sample with every placeholder replaced, as an operator following its README would:
each ``!vault`` value that decrypts to ``REPLACE-ME: ...`` is encrypted again, with the sample's vault
password, holding a value of the right shape (a per-file UUID for a token, 32 random bytes for the gossip
key). Nothing here is a real secret: the copy is only planned, never provisioned."""

from __future__ import annotations

import base64
import re
import shutil
import uuid
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[2] / "inventory" / "sample"
SAMPLE_VAULT_PASSWORD = "clusterctl-sample"  # inventory/sample/README.md says so; it guards placeholders only
_VALUE = re.compile(r"^(?P<name>\w+): !vault \|\n(?P<body>(?:[ \t]+\S.*\n?)+)", re.MULTILINE)


def sample_password_file(directory: Path) -> Path:
    path = directory / "sample-vault-pass"
    path.write_text(SAMPLE_VAULT_PASSWORD + "\n")
    path.chmod(0o600)
    return path


def _real_shaped(name: str, where: str) -> str:
    if name.endswith("gossip_key"):
        return base64.b64encode(uuid.uuid5(uuid.NAMESPACE_URL, where).bytes * 2).decode()
    if name.endswith("_pem"):
        return f"-----BEGIN TEST {name.upper()}-----\n{uuid.uuid5(uuid.NAMESPACE_URL, where)}\n-----END-----\n"
    return str(uuid.uuid5(uuid.NAMESPACE_URL, where))


def fill_placeholders(inventory: Path) -> int:
    """Replace every placeholder under ``inventory`` in place; returns how many were replaced."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    lib = VaultLib([("default", VaultSecret(SAMPLE_VAULT_PASSWORD.encode()))])
    count = 0

    def refill(match: re.Match, path: Path) -> str:
        nonlocal count
        ciphertext = "\n".join(line.strip() for line in match["body"].splitlines())
        if not lib.decrypt(ciphertext).decode().startswith("REPLACE-ME"):
            return match.group(0)
        count += 1
        value = _real_shaped(match["name"], f"{path.relative_to(inventory)}:{match['name']}")
        body = "".join(f"          {line}\n" for line in lib.encrypt(value).decode().splitlines())
        return f"{match['name']}: !vault |\n{body}"

    for path in sorted(inventory.rglob("*.yml")):
        text = path.read_text()
        path.write_text(_VALUE.sub(lambda m, p=path: refill(m, p), text))
    return count


def filled_sample(directory: Path) -> Path:
    """A copy of inventory/sample at ``directory/prod`` with its placeholders filled."""
    copy = directory / "prod"
    shutil.copytree(SAMPLE, copy)
    fill_placeholders(copy)
    return copy
