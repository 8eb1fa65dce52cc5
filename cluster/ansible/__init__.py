"""The one package of clusterctl that imports Ansible (tests/test_import_lint.py keeps it so).

:mod:`cluster.ansible.inventory` loads an inventory with Ansible's own InventoryManager and
VariableManager and templates/decrypts the variables of :mod:`cluster.spec`; :mod:`cluster.ansible.vault`
holds the vault secrets; callers import them from here. Everything else (the model, the typed settings,
preflight, the CLI) works on plain values.
Ansible itself is imported inside the functions that need it, so importing this package stays cheap.
"""
