"""clusterctl.infra.config_files: the host-state shortcut (pure) and the module on this machine's files.

The roles' use of it on simulated hosts (rendered files, idempotence, drift repair, check mode) is in
test_site_virtual.py; here are the edges: what counts as "already in place", item expansion, and the
module's own behaviour (check mode, diff, prune, a missing directory) through ansible-playbook on localhost
in a temp dir.
"""

from __future__ import annotations

import grp
import hashlib
import importlib.util
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
ACTION = REPO / "collections/ansible_collections/clusterctl/infra/plugins/action/config_files.py"


def load_action(path: Path):
    """An action plugin of the collection as a plain module (its pure parts are tested without Ansible)."""
    spec = importlib.util.spec_from_file_location(f"clusterctl_{path.stem}_action", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


action = load_action(ACTION)
USER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def state(directories: dict) -> dict:
    """A host_state result: directory -> {name: (content, mode)}, every directory scanned."""
    listed = {}
    for path, files in directories.items():
        if files is not None:
            listed[path] = {"mode": "0755", "owner": "root", "group": "root",
                            "files": {name: {"sha256": sha(content), "mode": mode, "owner": "root", "group": "root"}
                                      for name, (content, mode) in files.items()}}
    return {"directories": listed, "scanned": list(directories)}


def in_place(snapshot, directories=(), files=(), absent=(), prune=()) -> bool:
    return action.HostState(snapshot).in_place(list(directories), list(files), list(absent), list(prune))


def file(dest, content, mode="0644"):
    return {"dest": dest, "content": content, "mode": mode, "owner": "root", "group": "root"}


# ------------------------------------------------------------------------------ the shortcut


def test_everything_in_place_needs_no_host():
    snap = state({"/etc/x": {"a.conf": ("a\n", "0644")}})
    assert in_place(snap, [{"path": "/etc/x", "mode": "0755"}], [file("/etc/x/a.conf", "a\n")])


@pytest.mark.parametrize("wanted", [
    file("/etc/x/a.conf", "b\n"),                     # content
    file("/etc/x/a.conf", "a\n", mode="0600"),        # mode
    {**file("/etc/x/a.conf", "a\n"), "group": "vllm"},  # group
    file("/etc/x/new.conf", "n\n"),                   # a file not there yet
    file("/etc/unlisted/a.conf", "a\n"),              # a directory host_state did not look at
])
def test_any_difference_or_unknown_asks_the_host(wanted):
    assert not in_place(state({"/etc/x": {"a.conf": ("a\n", "0644")}}), files=[wanted])


def test_modes_compare_as_numbers():
    assert in_place(state({"/etc/x": {"a.conf": ("a\n", "0644")}}), files=[file("/etc/x/a.conf", "a\n", mode="644")])


def test_a_scanned_pattern_says_a_directory_is_missing():
    snap = {"directories": {}, "scanned": ["/etc/systemd/system/vllm-iu@*.service.d"]}
    assert not in_place(snap, directories=[{"path": "/etc/systemd/system/vllm-iu@0.service.d", "mode": "0755"}])
    assert in_place(snap, absent=["/etc/systemd/system/vllm-iu@0.service.d/old.conf"])


def test_a_symlink_or_special_file_is_never_in_place():
    snap = state({"/etc/x": {}})
    snap["directories"]["/etc/x"]["files"]["a.conf"] = {"type": "other", "sha256": None, "mode": "0777",
                                                       "owner": "root", "group": "root"}
    assert not in_place(snap, files=[file("/etc/x/a.conf", "a\n")])
    assert not in_place(snap, absent=["/etc/x/a.conf"])


def test_absent_and_prune():
    snap = state({"/etc/consul.d": {"vllm-iu-n1-iu0.json": ("{}", "0640"), "consul.hcl": ("x", "0640")}})
    assert not in_place(snap, absent=["/etc/consul.d/consul.hcl"])
    rule = {"path": "/etc/consul.d", "patterns": ["vllm-iu-*.json"]}
    assert not in_place(snap, prune=[rule])  # a definition no file entry wants
    assert in_place(snap, files=[file("/etc/consul.d/vllm-iu-n1-iu0.json", "{}", "0640")], prune=[rule])


def test_items_expand_dest_and_template_variable():
    entries = action.expand([{"src": "numa.conf.j2", "dest": "/etc/vllm-iu@{index}.d/numa.conf", "mode": "0644",
                              "items": [{"index": 0}, {"index": 1}], "loop_var": "iu"}], "dest")
    assert [(e["dest"], extra) for e, extra in entries] == [
        ("/etc/vllm-iu@0.d/numa.conf", {"iu": {"index": 0}}), ("/etc/vllm-iu@1.d/numa.conf", {"iu": {"index": 1}})]
    assert all("items" not in e for e, _ in entries)


def test_an_item_without_the_key_names_both():
    with pytest.raises(action.AnsibleActionFail, match=r"cannot fill '/etc/\{id\}.json' from item \{'index': 0\}"):
        action.expand([{"dest": "/etc/{id}.json", "items": [{"index": 0}]}], "dest")


# ------------------------------------------------------------------------------ the module, for real


def playbook(tmp_path: Path, task: dict, *flags: str, module: str = "clusterctl.infra.config_files") -> dict:
    """Run one ``module`` task on localhost; the task's result (via a registered var printed as JSON)."""
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "the task", module: task, "register": "out", "ignore_errors": True},
        {"name": "show", "ansible.builtin.debug": {"msg": "RESULT={{ out | to_json }}"}},
    ]}]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    run = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
                          "-e", f"ansible_python_interpreter={sys.executable}", str(book), *flags],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    line = next(line for line in run.stdout.splitlines() if "RESULT=" in line)
    return json.loads(line.split("RESULT=", 1)[1].rstrip('"').encode().decode("unicode_escape"))


def test_module_writes_checks_diffs_and_prunes(tmp_path):
    root = tmp_path / "etc"
    task = {"directories": [{"path": str(root / "d"), "mode": "0750", "owner": USER, "group": GROUP}],
            "files": [{"content": "one\n", "dest": str(root / "d" / "a.conf"), "mode": "0640",
                       "owner": USER, "group": GROUP}],
            "prune": [{"path": str(root / "d"), "patterns": ["*.json"]}]}
    checked = playbook(tmp_path, task, "--check", "--diff")
    assert checked["changed"] and not root.exists()          # check mode: reported, nothing written
    assert any(d.get("after") == "one\n" for d in checked["diff"])
    first = playbook(tmp_path, task)
    assert first["changed"] and (root / "d" / "a.conf").read_text() == "one\n"
    assert oct((root / "d" / "a.conf").stat().st_mode & 0o777) == "0o640"
    assert "content" not in json.dumps(first.get("invocation", {}))  # rendered files stay out of the result
    (root / "d" / "stale.json").write_text("{}")
    (root / "d" / "a.conf").chmod(0o644)
    repaired = playbook(tmp_path, task)
    assert sorted(c["action"] for c in repaired["changes"]) == ["attributes", "removed"]
    assert not (root / "d" / "stale.json").exists()
    assert playbook(tmp_path, task)["changed"] is False


def test_module_names_a_missing_directory(tmp_path):
    task = {"files": [{"content": "x\n", "dest": str(tmp_path / "nowhere" / "a.conf"), "mode": "0644",
                       "owner": USER, "group": GROUP}]}
    result = playbook(tmp_path, task)
    assert result["failed"] and "nowhere does not exist (list it under directories)" in result["msg"]


def test_a_new_file_is_never_wider_than_owner_only_before_its_mode_is_set(tmp_path):
    """Ansible's atomic_move gives a file it creates the umask's mode (0644
    under umask 022) before the module sets the entry's own (0600 for a token): a moment in which a secret
    is world-readable. The mode the file has when its attributes are set is recorded here."""
    from ansible.module_utils.basic import AnsibleModule
    from ansible.module_utils.testing import patch_module_args

    spec = importlib.util.spec_from_file_location(
        "clusterctl_config_files_module", REPO / "collections/ansible_collections/clusterctl/infra/plugins/modules/config_files.py")
    module_code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module_code)
    seen: list[int] = []

    class Recording(AnsibleModule):
        def set_fs_attributes_if_different(self, file_args, changed, *args, **kwargs):
            seen.append(os.stat(file_args["path"]).st_mode & 0o777)
            return super().set_fs_attributes_if_different(file_args, changed, *args, **kwargs)

    previous = os.umask(0o022)
    try:
        with patch_module_args({}):
            module = Recording(argument_spec={})
        dest = tmp_path / "consul.token"
        module_code.ensure_file(module, {"dest": str(dest), "content": "s3cret\n", "mode": "0600", "owner": USER,
                                         "group": GROUP}, [], [])
        umask_after = os.umask(0o022)
    finally:
        os.umask(previous)
    assert seen == [0o600] and dest.stat().st_mode & 0o777 == 0o600 and dest.read_text() == "s3cret\n"
    assert umask_after == 0o022  # the module put the umask back
