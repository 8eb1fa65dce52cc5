"""Ansible Vault secrets for clusterctl: from ``--vault-password-file`` or from Ansible's own configuration.

The inventory loader (:mod:`cluster.ansible.inventory`) needs them in two places: its DataLoader decrypts
files that are vault-encrypted as a whole (``group_vars/all/vault.yml``, an encrypted inventory source),
and an inline ``!vault`` value is decrypted when it is used, from Ansible's process-wide
``VaultSecretsContext``. The loader puts the secrets there only while it loads
(:func:`secrets_in_effect`), so every value clusterctl reads is decrypted then, once, and no later read
depends on which inventory this process loaded last.

Without ``--vault-password-file`` the secrets are the ones ansible-playbook would use without
``--vault-id``/``--vault-password-file``: ``DEFAULT_VAULT_IDENTITY_LIST`` then
``DEFAULT_VAULT_PASSWORD_FILE`` (``ANSIBLE_VAULT_PASSWORD_FILE`` or ``vault_password_file`` in
ansible.cfg). Nothing here prompts: a ``label@prompt`` vault id is skipped.

Ansible is imported lazily, so importing this module (the CLI's shared options do) stays cheap.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from common.errors import UsageError

# (vault id, Ansible VaultSecret): what DataLoader.set_vault_secrets and VaultSecretsContext hold.
VaultSecrets = list[tuple[str, Any]]

OPTION = "--vault-password-file"
NO_PASSWORD = f"vault-encrypted, and no vault password was given ({OPTION} or ANSIBLE_VAULT_PASSWORD_FILE)"
_EXEC_BITS = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
_PROMPTS = ("prompt", "prompt_ask_vault_pass")


class VaultPasswordFileError(UsageError):
    """A vault password file that is missing, not a file, readable by others or unusable (exit 2)."""


def check_vault_password_file(path: str | os.PathLike, name: str = OPTION) -> Path:
    """The absolute path of a usable vault password file, or VaultPasswordFileError (one line, exit 2).

    Ansible's rule decides what the file is: any execute bit makes it a script that Ansible runs (its
    stdout is the password, or a ``*-client`` script is asked per vault id), so a script may be readable
    by others; a plain file holds the password itself and must be 0600 (or 0400): no group/other bits.
    Only ``stat`` and ``access`` here; the content is never read. ``name`` says where the path came from.
    """
    given = Path(path).expanduser()
    name = f"{name} {given}"
    try:
        st = given.stat()
    except FileNotFoundError:
        raise VaultPasswordFileError(f"{name}: no such file") from None
    except OSError as exc:
        raise VaultPasswordFileError(f"{name}: cannot stat: {exc.strerror}") from None
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISREG(st.st_mode):
        raise VaultPasswordFileError(f"{name}: not a regular file (mode {stat.filemode(st.st_mode)})")
    if mode & _EXEC_BITS:
        if not os.access(given, os.X_OK):
            raise VaultPasswordFileError(
                f"{name}: mode {mode:04o}: executable bits make Ansible run it as a vault password script, "
                "but this user cannot execute it"
            )
    elif mode & 0o077:
        raise VaultPasswordFileError(
            f"{name}: mode {mode:04o} lets group/others read the vault password; run: chmod 600 {given}"
        )
    elif not os.access(given, os.R_OK):
        raise VaultPasswordFileError(f"{name}: mode {mode:04o}: not readable by this user")
    return given.resolve()


def load_vault_secrets(path: Path, vault_id: str = "default", name: str = OPTION) -> VaultSecrets:
    """Ansible's vault secret for a checked password file (read, or the script run, once, in memory only).

    The same file ansible-playbook gets: ``get_file_vault_secret`` is what ``--vault-password-file`` uses.
    An unusable file (empty, a script that fails) is a VaultPasswordFileError; Ansible's messages name
    the file, never its content.
    """
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import get_file_vault_secret

    try:
        secret = get_file_vault_secret(filename=str(path), vault_id=vault_id, loader=DataLoader())
        secret.load()
    except AnsibleError as exc:
        raise VaultPasswordFileError(f"{name} {path}: {' '.join(str(exc).split())}") from None
    return [(vault_id, secret)]


def secrets_for(path: Path | None) -> VaultSecrets | None:
    """The secrets of a checked ``--vault-password-file``; None (use Ansible's configuration) without one."""
    return load_vault_secrets(path) if path else None


def configured_vault_secrets() -> VaultSecrets:
    """The secrets Ansible's configuration names, in the order ansible-playbook tries them."""
    import ansible.constants as C

    secrets: VaultSecrets = []
    for slug in C.DEFAULT_VAULT_IDENTITY_LIST or []:
        label, source = slug.split("@", 1) if "@" in slug else (C.DEFAULT_VAULT_IDENTITY, slug)
        if source not in _PROMPTS:
            name = f"vault id {label} ({_setting_origin('DEFAULT_VAULT_IDENTITY_LIST', 'vault_identity_list')}):"
            secrets += load_vault_secrets(check_vault_password_file(source, name), label, name)
    if C.DEFAULT_VAULT_PASSWORD_FILE:
        name = _setting_origin("DEFAULT_VAULT_PASSWORD_FILE", "vault_password_file")
        path = check_vault_password_file(C.DEFAULT_VAULT_PASSWORD_FILE, name)
        secrets += load_vault_secrets(path, C.DEFAULT_VAULT_IDENTITY, name)
    return secrets


def _setting_origin(setting: str, ini_key: str) -> str:
    """``ANSIBLE_VAULT_PASSWORD_FILE`` when the setting came from the environment, else its ansible.cfg."""
    import ansible.constants as C

    _, origin = C.config.get_config_value_and_origin(setting)
    return origin.removeprefix("env: ") if origin.startswith("env: ") else f"{ini_key} in {origin}"


@contextlib.contextmanager
def secrets_in_effect(secrets: Sequence[tuple[str, Any]]) -> Iterator[None]:
    """Inline ``!vault`` values decrypt with ``secrets`` inside the block, and with none after it.

    Ansible's ``VaultSecretsContext`` is process-wide and can be initialised only once (its CLIs do it
    once per process); it is created empty on first use here and holds secrets only for the block.
    A value decrypted inside keeps its plaintext (Ansible caches it on the value).
    """
    from ansible.parsing.vault import VaultSecretsContext

    context = VaultSecretsContext.current(optional=True)
    if context is None:
        context = VaultSecretsContext([])
        VaultSecretsContext.initialize(context)
    previous = context.secrets
    context.secrets = list(secrets)
    try:
        yield
    finally:
        context.secrets = previous


def is_encrypted(value: Any) -> bool:
    """True for an inline ``!vault`` value (checked without decrypting it)."""
    from ansible.parsing.vault import EncryptedString

    return type(value) is EncryptedString


def ciphertext(value: Any) -> str | None:
    """An inline ``!vault`` value's ciphertext (read without decrypting it), else None."""
    return str(value._ciphertext) if is_encrypted(value) else None


def decrypted(value: Any) -> Any:
    """``value`` with an inline ``!vault`` value decrypted (a plain ``str``); anything else unchanged."""
    return str(value) if is_encrypted(value) else value


def undecryptable(hostvars: dict[str, dict[str, Any]], base: Path | None = None) -> list[str]:
    """One line per cause (no vault password; a password that does not decrypt) for the inline ``!vault``
    values (at any depth of a host's variables) that the secrets in effect cannot decrypt: how many values
    in how many files, the first one's variable, place and hosts. One missing password is one fact,
    whatever the number of values it leaves sealed. ``base``: places are shown relative to it."""
    from ansible.errors import AnsibleError

    # reason -> ciphertext -> (variable, place, hosts): a group_vars value every host inherits counts once
    failing: dict[str, dict[str, tuple[str, str | None, list[str]]]] = {}

    def visit(host: str, name: str, value: Any) -> None:
        if is_encrypted(value):
            try:
                decrypted(value)
            except (AnsibleError, ReferenceError) as exc:
                if (found := _failure_parts(exc)) is None:
                    raise
                seen = failing.setdefault(found[1], {}).setdefault(
                    ciphertext(value) or name, (name, _relative(origin(value) or found[0], base), []))
                seen[2].append(host)
        elif isinstance(value, dict):
            for key, item in value.items():
                visit(host, f"{name}.{key}", item)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                visit(host, f"{name}[{index}]", item)

    for host, variables in hostvars.items():
        for name, value in variables.items():
            visit(host, name, value)
    lines = []
    for reason, values in failing.items():
        (name, place, hosts), *others = values.values()
        shown = ", ".join(hosts[:3]) + (f" and {len(hosts) - 3} more" if len(hosts) > 3 else "")
        first = f"{name} ({place + ', ' if place else ''}hosts: {shown})"
        if others:
            files = {p.rpartition(":")[0] or p for _, p, _ in values.values() if p}
            first = (f"{len(values)} values in {len(files)} file{'s' if len(files) != 1 else ''} "
                     f"(first: {first})")
        lines.append(f"{first}: {reason}")
    return lines


def _relative(place: str | None, base: Path | None) -> str | None:
    if place is None or base is None:
        return place
    path, colon, line = place.partition(":")
    try:
        return Path(path).resolve().relative_to(base.resolve()).as_posix() + colon + line
    except ValueError:
        return place


def failure(exc: BaseException) -> str | None:
    """One line for a vault decryption failure in ``exc`` or what it wraps (file or value:line, and why);
    None when ``exc`` is not about vault."""
    if (found := _failure_parts(exc)) is None:
        return None
    where, reason = found
    return f"{where}: {reason}" if where else reason


def failure_reason(exc: BaseException) -> str | None:
    """Why a vault value did not decrypt (:data:`NO_PASSWORD`, or ``cannot decrypt: ...``), without where."""
    found = _failure_parts(exc)
    return found[1] if found else None


def _failure_parts(exc: BaseException) -> tuple[str | None, str] | None:
    """(where, why) of a vault decryption failure in ``exc`` or what it wraps; None when not about vault."""
    from ansible.parsing.vault import AnsibleVaultError

    seen: BaseException | None = exc
    while seen is not None:
        no_context = isinstance(seen, ReferenceError) and "VaultSecretsContext" in str(seen)
        # UndecryptableVaultError (Ansible-internal): a template used a vault value that did not decrypt
        if isinstance(seen, AnsibleVaultError) or no_context or type(seen).__name__ == "UndecryptableVaultError":
            text = " ".join(str(seen).split())
            # "must be specified" / "no vault secrets found": Ansible was given no secret at all
            no_secret = no_context or "must be specified" in text or "no vault secrets found" in text
            reason = NO_PASSWORD if no_secret else f"cannot decrypt: {text}"
            return origin(getattr(seen, "obj", None)), reason
        seen = seen.__cause__ or seen.__context__
    return None


def origin(value: Any) -> str | None:
    """``path`` or ``path:line`` that Ansible recorded for a value it loaded, if any."""
    if value is None:
        return None
    try:  # Ansible's data tags are not public API yet: without them, messages just lack the place
        from ansible._internal._datatag._tags import Origin
    except ImportError:  # pragma: no cover
        return None
    tag = Origin.get_tag(value)
    if tag is None or not tag.path:
        return None
    return f"{tag.path}:{tag.line_num}" if tag.line_num else tag.path
