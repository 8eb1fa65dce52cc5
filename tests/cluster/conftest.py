"""Fixtures of the cluster tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_ambient_vault(monkeypatch):
    """In-process runs use only what a test passes, whatever the developer's environment configures."""
    import ansible.constants as C

    monkeypatch.setattr(C, "DEFAULT_VAULT_PASSWORD_FILE", None)
    monkeypatch.setattr(C, "DEFAULT_VAULT_IDENTITY_LIST", [])
