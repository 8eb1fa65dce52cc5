"""A provisioned virtual cluster shared by the site tests: test_site_virtual, then test_site_virtual_drill_faults,
test_site_virtual_edges and test_site_virtual_operations (file order, all ``machines(order=9)``).

`clusterctl virtual create` (3 nodes in 2 racks, the last rack RoCE) + `up` in a tmp dir; one host gets a
different CPU topology so that CPU lists provably come from the host's sysfs. The eas-agent token is a
vault-encrypted variable on r01n01. site.yml runs once in --check --diff (must change nothing), then for real
(the machines' preinstalled driver is not the pin: it ends "reboot pending"), then with --allow-reboot (the
machines restart into the pinned driver), then again (must change nothing). `down` always runs in teardown.
(The cluster's class and inventory are in tests/helpers/provision.py.)
"""

from __future__ import annotations

import os

import pytest

from tests.helpers.provision import VirtualCluster, clusterctl, write_inventory


# One cluster for the four modules (package scope): each further provisioning of the same three machines cost
# CI 4-7 minutes. Nothing else in this package asks for it.
@pytest.fixture(scope="package")
def provisioned(tmp_path_factory) -> VirtualCluster:
    inventory = tmp_path_factory.mktemp("provision") / "inventory"
    write_inventory(inventory)
    env = dict(os.environ, ANSIBLE_VAULT_PASSWORD_FILE=str(inventory.parent / "vault-password"))
    cluster = VirtualCluster(inventory, ("r01n01", "r01n02", "r02n01"), env)
    up = clusterctl("virtual", "up", "-i", str(inventory))
    assert up.returncode == 0, up.stderr
    try:
        cluster.snapshots["fresh"] = cluster.upper_snapshot()
        cluster.provision("check", "--check", "--diff", "--batches", "100%")
        cluster.snapshots["after-check"] = cluster.upper_snapshot()
        cluster.provision("first", "--batches", "100%")
        cluster.snapshots["driver-after-first"] = cluster.driver_state()
        cluster.snapshots["ius-after-first"] = cluster.iu_states()
        cluster.provision("reboot", "--batches", "100%", "--allow-reboot")
        cluster.snapshots["driver-after-reboot"] = cluster.driver_state()
        cluster.provision("second", "--batches", "100%")
        yield cluster
    finally:
        down = clusterctl("virtual", "down", "-i", str(inventory))
        assert down.returncode == 0, down.stderr
