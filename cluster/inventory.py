"""Load an Ansible inventory exactly as Ansible resolves it and turn it into the cluster model.

Uses Ansible's own InventoryManager and VariableManager (INI or YAML sources, group_vars/, host_vars/,
patterns), so there is no second parser that could disagree with what ``ansible-playbook`` sees.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster import model, validate
from cluster.errors import ClusterctlError

# Variables the model reads; only these are templated (a vault value elsewhere is never decrypted).
MODEL_VARS = (
    "ansible_host", "rack", "gpu_model", "gpu_count", "iu_size", "iu_layout", "gpu_numa_nodes",
    "numa_node_count", "iu_port_base", "iu_ports", "rdma_nics", "nccl_socket_ifname", "cpu_cstates_redfish",
    "clusterctl_exec_prefix", "consul_http_addr", "consul_datacenter",
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


def _ansible_objects(path: Path):
    import ansible.constants as C
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    # Fail on an unparseable source instead of Ansible's default warning + empty inventory. Set on the
    # constant, not in os.environ, so child processes (ansible-lint's syntax checks) keep their default.
    C.INVENTORY_UNPARSED_IS_FAILED = True
    loader = DataLoader()
    try:
        inventory = InventoryManager(loader=loader, sources=[str(path)])
    except AnsibleError as exc:
        raise InventoryError(f"{path}: cannot parse inventory: {exc}") from None
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


def _resolve(loader, hostvars: dict[str, Any]) -> dict[str, Any]:
    from ansible.template import Templar

    templar = Templar(loader=loader, variables=hostvars)
    resolved = dict(hostvars)
    for key in MODEL_VARS:
        value = hostvars.get(key)
        if value is not None and has_template(value):
            resolved[key] = templar.template(value)
    return resolved


def load_inventory(path: str | os.PathLike, limit: str | None = None) -> LoadedInventory:
    path = Path(path)
    if not path.exists():
        raise InventoryError(f"{path}: inventory not found")
    loader, inventory, variables = _ansible_objects(path)
    from ansible.errors import AnsibleError

    everyone: dict[str, dict[str, Any]] = {}
    try:
        for host in inventory.get_hosts("all"):
            everyone[host.name] = _resolve(loader, variables.get_vars(host=host, include_hostvars=False))
        selected_names = [h.name for h in inventory.get_hosts(limit)] if limit else list(everyone)
    except AnsibleError as exc:
        raise InventoryError(f"{path}: {exc}") from None
    return LoadedInventory(path, {n: everyone[n] for n in selected_names}, everyone)


def load_cluster(path: str | os.PathLike, limit: str | None = None) -> model.Cluster:
    """Load, validate (raising InventoryError listing every problem) and build the cluster model."""
    loaded = load_inventory(path, limit)
    problems = validate.validate(loaded.selected, loaded.everyone)
    if problems:
        raise InventoryError(
            f"{loaded.path}: {len(problems)} inventory problem(s):\n{validate.format_problems(problems)}", problems
        )
    return model.build_cluster(loaded.selected)


def host_var(node: model.Node, key: str, default: Any = None) -> Any:
    """Any host variable of a node, templated the way Ansible would (the model's own are already)."""
    value = node.vars.get(key, default)
    if value is None or not has_template(value):
        return value if value is not None else default
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    return Templar(loader=DataLoader(), variables=dict(node.vars)).template(value)
