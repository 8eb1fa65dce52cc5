"""sim/hosts/run_state.py: which machines carry the provisioned stamp, read from their overlays (no machine is
booted), and the stamp it reads is the one every provisioning playbook writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from sim.hosts import run_state
from sim.hosts.state_dir import Layout

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[4]
STAMP = run_state.PROVISIONED_STAMP.lstrip("/")


def machine_upper(layout: Layout, host: str) -> Path:
    upper = layout.host(host).upper
    upper.mkdir(parents=True)
    return upper


def test_each_machine_with_the_stamp_is_named_with_its_time(tmp_path):
    layout = Layout(tmp_path / "state")
    for host, when in (("r01n01", 1_700_000_000), ("r01n02", None), ("r02n01", 1_700_000_100)):
        upper = machine_upper(layout, host)
        if when is not None:
            (upper / STAMP).parent.mkdir(parents=True)
            (upper / STAMP).write_text("provisioned\n")
            os.utime(upper / STAMP, (when, when))
    assert run_state.provisioned(layout) == {"r01n01": 1_700_000_000, "r02n01": 1_700_000_100}


def test_no_state_dir_or_no_machines_is_nothing_provisioned(tmp_path):
    assert run_state.provisioned(Layout(tmp_path / "absent")) == {}
    (tmp_path / "state").mkdir()
    assert run_state.provisioned(Layout(tmp_path / "state")) == {}


def test_what_a_machine_left_in_its_overlay_is_never_followed(tmp_path):
    """Root inside the machine writes the overlay: a symlink there must not make this host report (or stat) a
    file of its own."""
    outside = tmp_path / "outside"
    (outside / "lib" / "clusterctl").mkdir(parents=True)
    (outside / "lib" / "clusterctl" / "provisioned").write_text("not the machine's\n")
    layout = Layout(tmp_path / "state")
    (machine_upper(layout, "r01n01") / "var").symlink_to(outside)  # a directory on the path
    upper = machine_upper(layout, "r01n02")
    (upper / STAMP).parent.mkdir(parents=True)
    (upper / STAMP).symlink_to(outside / "lib" / "clusterctl" / "provisioned")  # the stamp itself
    upper = machine_upper(layout, "r01n03")
    (upper / STAMP).mkdir(parents=True)  # not a file
    (layout.machines_dir / "not a host name").mkdir()
    assert run_state.provisioned(layout) == {}


def test_a_symlinked_state_dir_is_not_read(tmp_path):
    real = Layout(tmp_path / "real")
    upper = machine_upper(real, "r01n01")
    (upper / STAMP).parent.mkdir(parents=True)
    (upper / STAMP).write_text("provisioned\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert list(run_state.provisioned(real)) == ["r01n01"]
    assert run_state.provisioned(Layout(tmp_path / "link")) == {}


def test_every_playbook_with_roles_writes_the_stamp_first_on_every_host():
    tasks = yaml.safe_load((REPO / "playbooks/tasks/provisioned.yml").read_text())
    assert [t["ansible.builtin.copy"]["dest"] for t in tasks if "ansible.builtin.copy" in t] == [
        run_state.PROVISIONED_STAMP]
    with_roles = []
    for playbook in sorted((REPO / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(playbook.read_text()):
            if not play.get("roles"):
                continue
            with_roles.append(playbook.name)
            pre = [(t.get("ansible.builtin.import_tasks"), t.get("tags")) for t in play.get("pre_tasks", [])]
            # after the two checks that change nothing (on hold, an OS the roles support), before anything else
            assert pre[:3] == [("tasks/hold.yml", ["always"]), ("tasks/supported_os.yml", ["always"]),
                               ("tasks/provisioned.yml", ["always"])], playbook.name
    assert "site.yml" in with_roles and len(with_roles) == 11
