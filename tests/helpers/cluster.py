"""What the cluster tests share: a two-host rack (``HOSTS``) and an encrypted inventory's pieces (Ansible's
VaultLib, in-process), and the fixture that keeps the developer's own vault settings out of them."""

from __future__ import annotations

from pathlib import Path

import pytest

PASSWORD = "inventory-vault-test-password-31f0"

HOSTS = """
all:
  children:
    rack_r1:
      hosts:
        n1: {ansible_host: 127.0.77.1}
        n2: {ansible_host: 127.0.77.2}
"""


def encrypt(text: str, password: str = PASSWORD) -> str:
    from ansible.parsing.vault import VaultLib, VaultSecret

    return VaultLib([("default", VaultSecret(password.encode()))]).encrypt(text).decode()


def inline(name: str, value: str) -> str:
    """``name: !vault |`` followed by the encrypted value, as ``ansible-vault encrypt_string`` writes it."""
    body = "".join(f"  {line}\n" for line in encrypt(value).splitlines())
    return f"{name}: !vault |\n{body}"


def password_file(directory: Path, text: str = PASSWORD, mode: int = 0o600) -> Path:
    path = directory / "vault-password"
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


@pytest.fixture(autouse=True)
def no_ambient_vault(monkeypatch):
    """In-process runs use only what a test passes, whatever the developer's environment configures."""
    import ansible.constants as C

    monkeypatch.setattr(C, "DEFAULT_VAULT_PASSWORD_FILE", None)
    monkeypatch.setattr(C, "DEFAULT_VAULT_IDENTITY_LIST", [])
