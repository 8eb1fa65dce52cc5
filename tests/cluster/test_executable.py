"""Review L6: ``inventory validate`` (and everything that loads an inventory) never runs an executable
inventory unless the operator sets CLUSTERCTL_ALLOW_INVENTORY_SCRIPTS=1."""

from __future__ import annotations

import sys

import pytest

from cluster import InventoryError, load_cluster
from cluster.ansible.inventory import ALLOW_SCRIPTS_ENV
from tests.helpers import run_cli

INVENTORY = {"gpu": {"hosts": ["n1"]}, "_meta": {"hostvars": {"n1": {"ansible_host": "127.0.0.1", "rack": "r1",
                                                                      "gpu_model": "h100-sxm"}}}}


def script(tmp_path, marker):
    path = tmp_path / "inv.py"
    path.write_text(
        f"#!{sys.executable}\nimport json, pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        f"print(json.dumps({INVENTORY!r}))\n"
    )
    path.chmod(0o755)
    return path


def test_validate_does_not_run_a_script(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(ALLOW_SCRIPTS_ENV, raising=False)
    marker = tmp_path / "marker"
    code, out, err = run_cli(capsys, "inventory", "validate", "-i", str(script(tmp_path, marker)))
    assert code == 2 and ALLOW_SCRIPTS_ENV in err and "executable inventory" in err
    assert not marker.exists()  # before: the script ran (the review's marker file appeared)


def test_a_script_inside_an_inventory_directory_is_refused_too(tmp_path, monkeypatch):
    monkeypatch.delenv(ALLOW_SCRIPTS_ENV, raising=False)
    marker = tmp_path / "marker"
    inv_dir = tmp_path / "inv"
    inv_dir.mkdir()
    script(inv_dir, marker)
    with pytest.raises(InventoryError, match="executable inventory"):
        load_cluster(inv_dir)
    assert not marker.exists()


def test_asked_for_the_script_runs(tmp_path, monkeypatch):
    monkeypatch.setenv(ALLOW_SCRIPTS_ENV, "1")
    marker = tmp_path / "marker"
    cluster = load_cluster(script(tmp_path, marker))
    assert marker.exists() and [n.name for n in cluster.nodes()] == ["n1"]
