"""The variables Ansible itself reads from an inventory: its magic variables (``inventory_hostname``,
``group_names``...), the connection and privilege variables (``ansible_host``, ``ansible_user``,
``ansible_become``...), and every variable its configuration and the plugins a run here uses (the ssh,
local and paramiko connections, sudo and su, the sh shell) declare. Read from Ansible's own constants and
option definitions, so a new Ansible's names come with it. :mod:`cluster.variables` adds them to the names
an inventory may set."""

from __future__ import annotations

from collections.abc import Mapping

# Ansible's variables that no constant lists: set by the play or by a module, never unknown in an inventory.
_OTHERS = ("omit", "ansible_check_mode", "ansible_loop_var", "ansible_index_var", "ansible_parent_role_names",
           "ansible_parent_role_paths", "ansible_search_path", "ansible_become")
_PLUGINS = (("connection", ("ssh", "local", "paramiko_ssh")), ("become", ("sudo", "su")), ("shell", ("sh",)))


def ansible_variables() -> set[str]:
    import ansible.constants as C
    from ansible.plugins import loader

    names = set(C.INTERNAL_STATIC_VARS) | set(C.COMMON_CONNECTION_VARS) | set(_OTHERS)
    names |= {name for aliases in C.MAGIC_VARIABLE_MAPPING.values() for name in aliases}
    definitions = [C.config.get_configuration_definitions()]
    for kind, plugins in _PLUGINS:
        plugin_loader = getattr(loader, f"{kind}_loader")
        for plugin in plugins:
            plugin_loader.get(plugin, class_only=True)  # registers the plugin's option definitions
            definitions.append(C.config.get_configuration_definitions(kind, plugin))
    for options in definitions:
        for option in (options or {}).values():
            names |= {v["name"] for v in option.get("vars") or [] if isinstance(v, Mapping) and "name" in v}
    return {n for n in names if not n.startswith("_")}
