"""Ansible Vault secrets for clusterctl: the import path the CLI uses.

The implementation imports Ansible and so lives in :mod:`cluster.ansible.vault` (only that package
imports Ansible); this module names its public API.
"""

from cluster.ansible.vault import (
    NO_PASSWORD,
    OPTION,
    VaultPasswordFileError,
    VaultSecrets,
    check_vault_password_file,
    ciphertext,
    configured_vault_secrets,
    decrypted,
    failure,
    is_encrypted,
    load_vault_secrets,
    origin,
    secrets_for,
    secrets_in_effect,
    undecryptable,
)

__all__ = [
    "NO_PASSWORD", "OPTION", "VaultPasswordFileError", "VaultSecrets", "check_vault_password_file", "ciphertext",
    "configured_vault_secrets", "decrypted", "failure", "is_encrypted", "load_vault_secrets", "origin",
    "secrets_for", "secrets_in_effect", "undecryptable",
]
