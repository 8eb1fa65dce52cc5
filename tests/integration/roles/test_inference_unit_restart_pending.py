"""inference_unit's "Restart pending" report (roles/inference_unit/tasks/main.yml) run unchanged by ansible-playbook
on localhost, with the facts the role's earlier tasks register: a vLLM version installed under running IUs is
reported like a changed configuration (the running processes keep the old version's modules loaded and import
the new one's lazily), never silently."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO
from tests.helpers.provision import ansible_playbook

pytestmark = pytest.mark.integration

IUS = [{"index": 0, "id": "n1-iu0"}, {"index": 1, "id": "n1-iu1"}]
RUNNING = {"vllm-iu@0.service": "enabled", "vllm-iu@1.service": "enabled"}
UNCHANGED = {"changed": False, "changes": []}


def report(tmp_path: Path, vllm: dict, env: dict = UNCHANGED, units: dict = RUNNING) -> str | None:
    task = next(t for t in yaml.safe_load((REPO / "roles/inference_unit/tasks/main.yml").read_text())
                if t["name"] == "Restart pending")
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"name": "report", "hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    (tmp_path / "extra.json").write_text(json.dumps({
        "ansible_python_interpreter": sys.executable, "inference_unit_restart_on_change": False,
        "clusterctl_render_only": False, "inference_unit_env_dir": "/etc/vllm-iu", "inference_unit_vllm_version": "0.6.4",
        "_inference_unit_node": {"ius": IUS}, "_inference_unit_state": {"units": units},
        "_inference_unit_template": UNCHANGED, "_inference_unit_env": env, "_inference_unit_key": UNCHANGED,
        "_inference_unit_started": {"results": []}, "_inference_unit_vllm": vllm,
    }))
    done = ansible_playbook(Path("localhost,"), "-c", "local", str(play), "-e", f"@{tmp_path / 'extra.json'}",
                            env=dict(os.environ, ANSIBLE_CALLBACK_RESULT_FORMAT="json"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    found = re.search(r'"msg": "(restart pending: [^"]*)"', done.stdout)
    return found.group(1) if found else None


def test_a_vllm_installed_under_running_ius_is_a_restart_pending_for_every_iu(tmp_path):
    assert report(tmp_path, {"changed": True}) == (
        "restart pending: n1-iu0, n1-iu1 (vLLM 0.6.4 installed; run playbooks/rolling-restart.yml)")


def test_both_reasons_are_named(tmp_path):
    env = {"changed": True, "changes": [{"path": "/etc/vllm-iu/1.env", "action": "updated"}]}
    assert report(tmp_path, {"changed": True}, env=env) == (
        "restart pending: n1-iu0, n1-iu1 (vLLM 0.6.4 installed, configuration changed; run "
        "playbooks/rolling-restart.yml)")
    assert report(tmp_path, {"changed": False}, env=env) == (
        "restart pending: n1-iu1 (configuration changed; run playbooks/rolling-restart.yml)")


def test_nothing_is_pending_when_vllm_is_unchanged_or_the_ius_are_new(tmp_path):
    assert report(tmp_path, {"changed": False}) is None
    assert report(tmp_path, {"skipped": True}) is None  # render-only or a fresh host in check mode
    new = {"vllm-iu@0.service": "not-found", "vllm-iu@1.service": "not-found"}
    assert report(tmp_path, {"changed": True}, units=new) is None  # they start with the new vLLM
