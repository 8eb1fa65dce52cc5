"""The batches of a rollout: the Consul servers start together in a play of their own before the batched
play (with `bootstrap_expect` = 3 and one host in batch 1, the first server waits alone
for a leader and batch 1 fails on every new production cluster), and `clusterctl provision`'s plan is the
batches Ansible itself forms: checked by running ansible-playbook over the sample inventory (2 racks x 4
nodes, 3 dedicated Consul servers) with each play's header (hosts, serial) and one task that prints the batch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cluster.ansible.inventory import InventoryError
from provision import plan as prov
from provision.rollout import Rollout
from tests.helpers.inventory import SAMPLE, filled_sample, sample_password_file

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
SERVERS = ("consul01", "consul02", "consul03")  # inventory/sample/hosts.yml's consul_servers, all dedicated


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """The sample with its placeholders filled (the plan refuses placeholders): (inventory, secrets)."""
    from cluster.ansible import vault

    directory = tmp_path_factory.mktemp("sample")
    return filled_sample(directory), vault.secrets_for(sample_password_file(directory))


def ansible_batches(tmp_path: Path, playbook: str, limit: str | None, sizes: list) -> list[list[str]]:
    """The batches ansible-playbook forms for ``playbook``'s plays over the sample inventory: each play's
    own hosts / serial / max_fail_percentage, its roles replaced by one task printing ``ansible_play_batch``."""
    plays = []
    for play in prov.playbook_plays(prov.PLAYBOOK_DIR / playbook):
        header = {k: play[k] for k in ("name", "hosts", "serial", "max_fail_percentage") if k in play}
        plays.append({**header, "gather_facts": False, "tasks": [{
            "name": "batch", "ansible.builtin.debug": {"msg": "BATCH {{ ansible_play_batch | join(',') }}"},
            "run_once": True}]})
    path = tmp_path / "batches.yml"
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_RETRY_FILES_ENABLED": "0"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(SAMPLE), str(path),
         "-e", "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}",
         "-e", yaml.safe_dump({"clusterctl_batches": sizes}, default_flow_style=True).strip(),
         *(["--limit", limit] if limit else [])],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [line.split(",") for line in re.findall(r"BATCH ([\w,]+)", done.stdout)]


@pytest.mark.parametrize(("playbook", "limit", "sizes"), [
    ("site.yml", None, list(prov.DEFAULT_BATCHES)),
    ("inference.yml", None, [1, "50%"]),
    ("site.yml", "rack_r02", list(prov.DEFAULT_BATCHES)),
    ("cpu.yml", None, list(prov.DEFAULT_BATCHES)),
    ("network.yml", "consul02:rack_r01", [1, "100%"]),
])
def test_the_plan_is_the_batches_ansible_runs(tmp_path, filled, playbook, limit, sizes):
    plan = prov.make_plan(filled[0], playbook, limit, (), sizes, vault_secrets=filled[1])
    assert [list(b) for b in plan.batches] == ansible_batches(tmp_path, playbook, limit, sizes)


def test_a_new_cluster_s_servers_start_together_before_the_first_batch(filled):
    plan = prov.make_plan(filled[0], "site.yml", vault_secrets=filled[1])
    assert plan.batches[0] == SERVERS
    assert [r.role for r in plan.plays[0].roles] == ["consul_agent"]
    # then the dedicated servers one at a time, and the batched play over the GPU nodes: a canary of one host
    # first, every GPU node once, no server
    assert [plan.batches[i] for i in plan.plays[1].batches] == [(server,) for server in SERVERS]
    main = [plan.batches[i] for i in plan.plays[2].batches]
    assert main[0] == ("r01n01",) and sorted(h for b in main for h in b) == sorted(set(plan.hosts) - set(SERVERS))


def test_every_playbook_with_the_consul_role_starts_the_servers_first():
    for path in sorted(prov.PLAYBOOK_DIR.glob("*.yml")):
        plays = prov.playbook_plays(path)
        roles = [step.role for play in plays for step in prov.play_roles(play)]
        if "consul_agent" in roles and path.name != "consul-servers.yml":
            first = plays[0]
            assert (first["hosts"], "serial" in first) == ("consul_servers", False), path.name
            assert [s.role for s in prov.play_roles(first)] == ["consul_agent"], path.name


def test_the_role_and_the_play_name_the_same_server_group():
    hcl = (REPO / "roles/consul_agent/templates/consul.hcl.j2").read_text()
    assert "bootstrap_expect = {{ groups['consul_servers'] | length }}" in hcl
    assert prov.playbook_plays(prov.PLAYBOOK_DIR / "consul-servers.yml")[0]["hosts"] == "consul_servers"


def test_a_play_pattern_the_plan_cannot_follow_is_an_error_naming_it():
    with pytest.raises(InventoryError, match=r"x.yml: play 1 \(p\): hosts 'web\*:&db'"):
        prov.play_hosts("web*:&db", ["a"], {}, ["a"], "x.yml: play 1 (p)")
    with pytest.raises(InventoryError, match=r"serial '\{\{ other \}\}'"):
        prov.play_serial("{{ other }}", [1], "x.yml: play 1 (p)")
    assert prov.play_serial(None, [1], "") == ["100%"] and prov.play_serial(1, [5], "") == [1]


def _plan(batches, plays) -> prov.Plan:
    """Plays named "reboot ..." run tasks only (as consul-servers-reboot.yml), the others a role."""
    hosts = tuple(dict.fromkeys(h for b in batches for h in b))
    role = (prov.RoleStep("consul_agent", ()),)
    return prov.Plan(inventory=Path("inv"), playbook=Path("site.yml"), hosts=hosts,
                     batches=tuple(tuple(b) for b in batches), batch_sizes=(1, "100%"), roles=(),
                     plays=tuple(prov.PlayPlan(name, () if name.startswith("reboot") else role, tuple(idx))
                                 for name, idx in plays))


def _events(*items):
    for kind, host, task in items:
        yield {"event": kind, "event_data": {"host": host, "task": task, "res": {}} if host else {}}


def test_a_server_done_with_its_consul_play_is_partly_done_until_its_main_batch_runs():
    plan = _plan([["s1"], ["s1"], ["c1"]], [("servers", [0]), ("main", [1, 2])])
    rollout = Rollout(plan, clock=lambda: 0.0)
    for event in _events(("playbook_on_play_start", None, ""), ("runner_on_start", "s1", "Install Consul"),
                         ("runner_on_ok", "s1", "Install Consul"), ("playbook_on_play_start", None, "")):
        rollout.handle(event)
    assert rollout.hosts["s1"].label == "partly done" and rollout.hosts["s1"].batch == 1
    for event in _events(("runner_on_start", "s1", "x"), ("runner_on_ok", "s1", "x"),
                         ("playbook_on_play_start", None, ""), ("runner_on_start", "c1", "x"),
                         ("runner_on_failed", "c1", "x")):
        rollout.handle(event)
    rollout.handle({"event": "playbook_on_stats", "event_data": {"ok": {"s1": 2}, "failures": {"c1": 1}}})
    assert rollout.summary() == "rollout stopped in batch 3/3: failed/unreachable: c1; done: s1"


def test_a_run_stopped_before_a_server_s_main_batch_says_it_is_partly_done():
    plan = _plan([["s1", "s2"], ["s1"], ["c1"], ["s2"]], [("servers", [0]), ("main", [1, 2, 3])])
    rollout = Rollout(plan, clock=lambda: 0.0)
    notices = []
    for event in _events(("playbook_on_play_start", None, ""), ("runner_on_start", "s1", "x"),
                         ("runner_on_ok", "s1", "x"), ("runner_on_start", "s2", "x"), ("runner_on_ok", "s2", "x"),
                         ("playbook_on_play_start", None, ""), ("runner_on_start", "s1", "x"),
                         ("runner_on_failed", "s1", "x")):
        rollout.handle(event)
        notices += rollout.notices
        rollout.notices.clear()
    rollout.handle({"event": "playbook_on_stats", "event_data": {"ok": {"s2": 1}, "failures": {"s1": 1}}})
    assert notices[0] == "batch 1/4 started: 2 hosts (s1, s2), play 'servers'"
    assert "s2: partly done" in notices and "batch 1/4 finished in 0.0s: 0 ok, 2 partly done" in notices
    assert rollout.summary() == ("rollout stopped in batch 2/4: failed/unreachable: s1; "
                                 "partly done (their later batch never started): s2; not started: c1")
    assert not rollout.succeeded(2)


def test_a_play_that_matches_no_host_starts_no_batch():
    # --limit without a server: Ansible still announces the servers' play, then "no hosts matched"
    plan = _plan([["c1"], ["c2"]], [("servers", []), ("main", [0, 1])])
    rollout = Rollout(plan, clock=lambda: 0.0)
    rollout.handle({"event": "playbook_on_play_start", "event_data": {}})
    assert rollout.batches_started == 0 and not rollout.notices
    rollout.handle({"event": "playbook_on_play_start", "event_data": {}})
    assert rollout.notices == ["batch 1/2 started: 1 host (c1), play 'main'"]


def test_a_server_rebooted_by_the_last_play_is_no_longer_reboot_pending():
    plan = _plan([["s1"], ["c1"], ["s1"]], [("main", [0, 1]), ("reboot servers", [2])])
    rollout = Rollout(plan, clock=lambda: 0.0)
    for kind, host, task, res in [
        ("playbook_on_play_start", None, "", {}),
        ("runner_on_ok", "s1", "Reboot pending", {"msg": "reboot pending: NVIDIA driver 550.127.08 installed "
                                                  "(a Consul server: rebooted by the last play, one server at a time)"}),
        ("playbook_on_play_start", None, "", {}), ("runner_on_ok", "c1", "Reboot the host", {"changed": True}),
        ("playbook_on_play_start", None, "", {}), ("runner_on_ok", "s1", "Reboot the host", {"changed": True}),
    ]:
        rollout.handle({"event": kind, "event_data": {"host": host, "task": task, "res": res} if host else {}})
    assert rollout.reboot_pending == {} and rollout.rebooted == ["c1", "s1"]


def test_a_server_whose_last_batch_ran_no_task_is_done():
    # a later play's batch in which the host ran no task (every one skipped: no runner_on_start)
    plan = _plan([["s1"], ["s1"]], [("servers", [0]), ("main", [1])])
    rollout = Rollout(plan, clock=lambda: 0.0)
    for event in _events(("playbook_on_play_start", None, ""), ("runner_on_start", "s1", "x"),
                         ("runner_on_ok", "s1", "x"), ("playbook_on_play_start", None, "")):
        rollout.handle(event)
    assert rollout.hosts["s1"].label == "partly done"
    rollout.handle({"event": "playbook_on_stats", "event_data": {"ok": {"s1": 1}}})
    assert rollout.hosts["s1"].status == "ok" and rollout.succeeded(0)


def test_the_servers_reboot_play_leaves_no_host_partly_done():
    plan = _plan([["s1"], ["c1"], ["s1"]], [("main", [0, 1]), ("reboot servers", [2])])
    rollout = Rollout(plan, clock=lambda: 0.0)
    for event in _events(("playbook_on_play_start", None, ""), ("runner_on_start", "s1", "x"),
                         ("runner_on_ok", "s1", "x"), ("playbook_on_play_start", None, "")):
        rollout.handle(event)
    assert rollout.hosts["s1"].status == "ok"


def test_running_ius_with_a_changed_configuration_are_one_recap_line():
    plan = _plan([["n1", "n2"]], [("main", [0])])
    rollout = Rollout(plan, clock=lambda: 0.0)
    rollout.handle({"event": "playbook_on_play_start", "event_data": {}})
    for host in ("n2", "n1"):
        rollout.handle({"event": "runner_on_ok", "event_data": {"host": host, "task": "Restart pending", "res": {
            "msg": f"restart pending: {host}-iu1 (configuration changed; run playbooks/rolling-restart.yml)"}}})
    assert rollout.restart_line() == (
        "IU restart pending on 2 hosts: n1: n1-iu1 (configuration changed; run playbooks/rolling-restart.yml); "
        "n2: n2-iu1 (configuration changed; run playbooks/rolling-restart.yml)")
    assert Rollout(plan, clock=lambda: 0.0).restart_line() is None
