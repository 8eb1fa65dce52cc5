"""Load an Ansible inventory exactly as Ansible resolves it and turn it into the cluster model.

Uses Ansible's own InventoryManager and VariableManager (INI or YAML sources, group_vars/, host_vars/,
patterns), so there is no second parser that could disagree with what ``ansible-playbook`` sees.

Vault: ``vault_secrets`` (:mod:`cluster.vault`, e.g. from ``--vault-password-file``) decrypt vars files
encrypted as a whole and inline ``!vault`` values; without them, the secrets Ansible's configuration
names (``ANSIBLE_VAULT_PASSWORD_FILE``...) are used, as ansible-playbook would. Only the model's
variables are decrypted here; anything that cannot be is a one-line InventoryError naming where.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster import model, validate, vault
from cluster.errors import ClusterctlError

# Variables the model reads; only these are templated (a vault value elsewhere is never decrypted).
MODEL_VARS = (
    "ansible_host", "rack", "gpu_model", "gpu_count", "iu_size", "iu_layout", "gpu_numa_nodes",
    "numa_node_count", "iu_port_base", "iu_ports", "rdma_nics", "nccl_socket_ifname", "cpu_cstates_redfish",
    "consul_http_addr", "consul_datacenter",
)


class InventoryError(ClusterctlError):
    exit_code = 2

    def __init__(self, message: str, problems: list[validate.Problem] | None = None):
        super().__init__(message)
        self.problems = problems or []


@dataclass
class LoadedInventory:
    path: Path
    selected: dict[str, dict[str, Any]]  # host -> resolved variables, for the --limit selection
    everyone: dict[str, dict[str, Any]]  # host -> resolved variables, whole inventory


def _ansible_objects(path: Path, vault_secrets: vault.VaultSecrets | None = None):
    """Ansible's loader, inventory and variable manager for ``path``, with the vault secrets in effect
    (``vault_secrets``, else those Ansible's configuration names), which also become the process's."""
    import ansible.constants as C
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    # Fail on an unparseable source instead of Ansible's default warning + empty inventory. Set on the
    # constant, not in os.environ, so child processes (ansible-lint's syntax checks) keep their default.
    C.INVENTORY_UNPARSED_IS_FAILED = True
    secrets = list(vault_secrets) if vault_secrets is not None else vault.configured_vault_secrets()
    vault.activate(secrets)  # inline !vault values decrypt from Ansible's process-wide context
    loader = DataLoader()
    loader.set_vault_secrets(secrets)  # before the inventory is parsed: its source may be encrypted too
    try:
        inventory = InventoryManager(loader=loader, sources=[str(path)])
    except AnsibleError as exc:
        raise _error(path, exc, "cannot parse inventory: ") from None
    return loader, inventory, VariableManager(loader=loader, inventory=inventory)


def has_template(value: Any) -> bool:
    """True when a string anywhere in ``value`` (nested lists/mappings too) holds Jinja2 syntax."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, list | tuple):
        return any(has_template(v) for v in value)
    if isinstance(value, Mapping):
        return any(has_template(v) for v in value.values())
    return False


def _error(path: Path, exc: BaseException, what: str = "") -> InventoryError:
    """One-line InventoryError for an Ansible error; a vault failure says which file or value, and why."""
    return InventoryError(f"{path}: {what}{vault.failure(exc) or ' '.join(str(exc).split())}")


def _resolve(path: Path, host: str, loader, hostvars: dict[str, Any]) -> dict[str, Any]:
    """The host's variables with the model's own decrypted (inline ``!vault``) and templated."""
    from ansible.errors import AnsibleError
    from ansible.template import Templar

    templar = Templar(loader=loader, variables=hostvars)
    resolved = dict(hostvars)
    for key in MODEL_VARS:
        value = hostvars.get(key)
        try:
            if vault.is_encrypted(value):
                resolved[key] = vault.decrypted(value)
            elif value is not None and has_template(value):
                resolved[key] = templar.template(value)
        except AnsibleError as exc:
            raise _error(path, exc, f"{host}: {key}: ") from None
    return resolved


def load_inventory(
    path: str | os.PathLike, limit: str | None = None, vault_secrets: vault.VaultSecrets | None = None
) -> LoadedInventory:
    path = Path(path)
    if not path.exists():
        raise InventoryError(f"{path}: inventory not found")
    loader, inventory, variables = _ansible_objects(path, vault_secrets)
    from ansible.errors import AnsibleError

    everyone: dict[str, dict[str, Any]] = {}
    try:
        for host in inventory.get_hosts("all"):
            hostvars = variables.get_vars(host=host, include_hostvars=False)
            everyone[host.name] = _resolve(path, host.name, loader, hostvars)
        selected_names = [h.name for h in inventory.get_hosts(limit)] if limit else list(everyone)
    except AnsibleError as exc:
        raise _error(path, exc) from None
    return LoadedInventory(path, {n: everyone[n] for n in selected_names}, everyone)


def load_cluster(
    path: str | os.PathLike, limit: str | None = None, vault_secrets: vault.VaultSecrets | None = None
) -> model.Cluster:
    """Load, validate (raising InventoryError listing every problem) and build the cluster model."""
    return cluster_of(load_inventory(path, limit, vault_secrets))


def cluster_of(loaded: LoadedInventory) -> model.Cluster:
    """Validate an already loaded inventory (InventoryError listing every problem) and build the model."""
    problems = validate.validate(loaded.selected, loaded.everyone)
    if problems:
        raise InventoryError(
            f"{loaded.path}: {len(problems)} inventory problem(s):\n{validate.format_problems(problems)}", problems
        )
    return model.build_cluster(loaded.selected)


def host_var(node: model.Node, key: str, default: Any = None) -> Any:
    """Any host variable of a node, templated (and a ``!vault`` value decrypted) the way Ansible would
    (the model's own are already), with the vault secrets of the last inventory load."""
    value = node.vars.get(key, default)
    if value is None:
        return default
    if not vault.is_encrypted(value) and not has_template(value):
        return value
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    try:
        if vault.is_encrypted(value):
            return vault.decrypted(value)
        return Templar(loader=DataLoader(), variables=dict(node.vars)).template(value)
    except (AnsibleError, ReferenceError) as exc:  # ReferenceError: no inventory was loaded in this process
        if vault.failure(exc) is None:
            raise
        raise InventoryError(f"{node.name}: {key}: {vault.failure(exc)}") from None
