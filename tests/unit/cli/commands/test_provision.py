"""What `clusterctl provision` prints: per-host state as it changes, a plain line per event off a TTY,
--diff's diffs with secrets masked, --check's wording, unknown tags and empty limits as errors.

The playbook run is replayed from recorded-shape ansible-runner events (``ansible_runner.run`` is
replaced), so these tests need no simulated hosts; tests/machines/provision/test_site_virtual.py runs the real one.
"""

from __future__ import annotations

import ansible_runner
import pytest

from provision.plan import make_plan
from provision.rollout import Rollout, mask_secrets
from tests.helpers.cli import one_line, stamp_provisioned

pytestmark = pytest.mark.unit

HOSTS = ("r01n01", "r01n02", "r02n01", "r02n02")  # the virtual_inventory fixture's, in play order


def ev(kind: str, **data) -> dict:
    return {"event": kind, "event_data": data}


CHRONY_DIFF = {"before_header": "/etc/chrony/chrony.conf", "after_header": "/etc/chrony/chrony.conf",
               "before": "pool 2.debian.pool.ntp.org iburst\n",
               "after": "pool time.example.internal iburst\ngossip_key: c2VjcmV0\n"}

EVENTS = [
    ev("playbook_on_play_start"),  # playbooks/consul-servers.yml: the virtual inventory's one server, r01n01
    ev("runner_on_start", host="r01n01", task="Install the pinned Consul version"),
    ev("runner_on_ok", host="r01n01", task="Install the pinned Consul version", res={"changed": False}),
    # playbooks/dedicated-consul-servers.yml: the virtual inventory has none (Ansible: no hosts matched)
    ev("playbook_on_play_start"), ev("playbook_on_no_hosts_matched"),
    ev("playbook_on_play_start"),
    ev("runner_on_start", host="r01n01", task="Write chrony.conf"),
    ev("runner_on_ok", host="r01n01", task="Write chrony.conf", res={"changed": True, "diff": [CHRONY_DIFF]}),
    ev("playbook_on_play_start"),
    ev("runner_on_start", host="r01n02", task="Check that there is a time source"),
    ev("runner_on_failed", host="r01n02", task="Check that there is a time source",
       res={"msg": "no time source [/] (chrony_servers and chrony_pools are both empty)"}),
    ev("playbook_on_stats", ok={"r01n01": 1, "r01n02": 0}, changed={"r01n01": 1}, failures={"r01n02": 1}),
]
GOOD_EVENTS = [e for e in EVENTS[:8]] + [
    ev("playbook_on_play_start"),
    *[ev("runner_on_ok", host=h, task="Write chrony.conf", res={"changed": False}) for h in HOSTS[1:]],
    # playbooks/edges.yml: the edges one at a time (r01n01, r02n01), then the balancer (r01n01)
    *[e for h in ("r01n01", "r02n01", "r01n01") for e in (
        ev("playbook_on_play_start"), ev("runner_on_ok", host=h, task="Write the edge config", res={"changed": False}))],
    ev("playbook_on_play_start"),  # playbooks/consul-servers-reboot.yml: r01n01, nothing to reboot for
    ev("runner_on_skipped", host="r01n01", task="Wait until every other Consul server is healthy"),
    ev("playbook_on_stats", ok={h: 1 for h in HOSTS}, changed={"r01n01": 1}),
]


@pytest.fixture
def replay(monkeypatch):
    """ansible_runner.run feeds ``replay.events`` to the event handler and returns ``replay.rc``."""

    class Replay:
        events, rc, calls = EVENTS, 2, []

        def run(self, **kwargs):
            self.calls.append(kwargs)
            for event in self.events:
                kwargs["event_handler"](event)
            return type("Result", (), {"rc": self.rc})()

    replayer = Replay()
    monkeypatch.setattr(ansible_runner, "run", replayer.run)
    return replayer


def provision(clusterctl, inventory, tmp_path, *args, columns=100):
    return clusterctl("provision", "-i", str(inventory), "--batches", "1,100%", "--run-dir", str(tmp_path / "run"),
                      "--yes", *args, columns=columns)


def test_piped_output_is_one_line_per_event_as_it_happens(clusterctl, virtual_inventory, tmp_path, replay,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = provision(clusterctl, virtual_inventory, tmp_path)
    assert code == 1
    lines = out.splitlines()
    expected = [
        "batch 1/7 started: 1 host (r01n01), play 'Start the Consul servers together'",
        "r01n01: partly done",
        "batch 1/7 finished in",
        "batch 2/7 started: 1 host (r01n01), play 'Provision GPU inference nodes'",
        "batch 2/7 finished in",  # r01n01's edge (batch 4) and balancer (6) are to come
        "batch 3/7 started: 3 hosts (r01n02, r02n01, r02n02)",
        "r01n02: FAILED Check that there is a time source: no time source [/] (chrony_servers and chrony_pools",
    ]
    positions = [next(i for i, line in enumerate(lines) if line.startswith(e)) for e in expected]
    assert positions == sorted(positions), out  # in the order they happened, before the recap
    assert positions[-1] < next(i for i, line in enumerate(lines) if "provision recap" in line)
    # empty categories are left out; hosts that never started say so
    assert " ".join(" ".join(lines[-3:-1]).split()) == ("rollout stopped in batch 3/7: failed/unreachable: r01n02; partly done (their "
                                      "later batch never started): r01n01; not started: r02n01, r02n02")
    assert "│ r02n01 │     3 │ not started │" in out


def test_plain_flag_on_a_terminal_too(clusterctl, virtual_inventory, tmp_path, replay, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FORCE_COLOR", "0")
    monkeypatch.setattr("rich.console.Console.is_terminal", property(lambda self: True))
    code, out, _ = provision(clusterctl, virtual_inventory, tmp_path)
    assert "batch 1/7 started" not in out  # the live view (transient) instead of lines
    code, out, _ = provision(clusterctl, virtual_inventory, tmp_path, "--plain")
    assert "batch 1/7 started: 1 host (r01n01)" in out


def test_live_view_shows_a_host_with_batches_to_come_as_partly_done_while_the_next_batch_runs(virtual_inventory):
    plan = make_plan(virtual_inventory, batch_sizes=[1, "100%"])
    rollout = Rollout(plan)
    for event in EVENTS[:10]:  # batch 3 has started, r01n02 is running
        rollout.handle(event)
    # r01n01 is done with the nodes' plays; its edge and its balancer (edges.yml) are still to come
    assert (rollout.hosts["r01n01"].status, rollout.hosts["r01n02"].status) == ("partial", "running")
    assert rollout.hosts["r02n01"].label == "not started"


def test_diff_prints_each_hosts_diff_with_secrets_masked(clusterctl, virtual_inventory, tmp_path, replay,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    replay.events, replay.rc = GOOD_EVENTS, 0
    code, out, _ = provision(clusterctl, virtual_inventory, tmp_path, "--diff")
    assert code == 0
    assert "== r01n01: Write chrony.conf (changed)" in out
    assert "-pool 2.debian.pool.ntp.org iburst" in out and "+pool time.example.internal iburst" in out
    assert "+gossip_key: ********" in out and "c2VjcmV0" not in out
    assert replay.calls[-1]["cmdline"] == "--diff"


def test_check_says_nothing_changed_and_what_would(clusterctl, virtual_inventory, tmp_path, replay, monkeypatch):
    monkeypatch.chdir(tmp_path)
    replay.events, replay.rc = GOOD_EVENTS, 0
    code, out, _ = provision(clusterctl, virtual_inventory, tmp_path, "--check", "--diff")
    assert code == 0
    assert "rollout complete" not in out
    assert "check mode: nothing was changed; 1 change would be made on 1 host (r01n01)" in out
    assert "== r01n01: Write chrony.conf (would change)" in out


def test_diff_names_changes_that_carry_no_diff_instead_of_saying_nothing_changed(
        clusterctl, virtual_inventory, tmp_path, replay, monkeypatch):
    """A no_log task (Ansible sends only ``censored``) and a mode-only change used to print "diff: no file would
    change" right above "2 changes would be made"."""
    monkeypatch.chdir(tmp_path)
    censored = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"
    mode_only = {"before": {"path": "/etc/consul.d", "mode": "0755"}, "after": {"path": "/etc/consul.d", "mode": "0750"}}
    replay.rc = 0
    replay.events = [
        ev("playbook_on_play_start"),
        ev("runner_on_ok", host="r01n01", task="Write consul.hcl", res={"changed": True, "censored": censored}),
        ev("runner_on_ok", host="r01n01", task="Consul config directory", res={"changed": True, "diff": mode_only}),
        ev("runner_on_ok", host="r01n01", task="Read the Consul version", res={"changed": False}),
        ev("playbook_on_play_start"),
        ev("playbook_on_stats", ok={h: 1 for h in HOSTS}, changed={"r01n01": 2}),
    ]
    code, out, _ = provision(clusterctl, virtual_inventory, tmp_path, "--check", "--diff")
    assert code == 0
    assert "no file would change" not in out
    assert "== r01n01: Write consul.hcl (would change; diff hidden: no_log)" in out
    assert "== r01n01: Consul config directory (would change)\n-mode: 0755\n+mode: 0750\n" in out
    assert "Read the Consul version" not in out
    assert "check mode: nothing was changed; 2 changes would be made on 1 host (r01n01)" in out


def test_diff_with_changes_but_no_task_results_does_not_say_nothing_changed(
        clusterctl, virtual_inventory, tmp_path, replay, monkeypatch):
    monkeypatch.chdir(tmp_path)
    replay.rc = 0
    replay.events = [ev("playbook_on_play_start"), ev("playbook_on_play_start"),
                     ev("playbook_on_stats", ok={h: 1 for h in HOSTS}, changed={"r01n02": 1})]
    code, out, _ = provision(clusterctl, virtual_inventory, tmp_path, "--check", "--diff")
    assert code == 0 and "no file would change" not in out
    assert "diff: 1 change would be made, none of them reported a diff (events.jsonl has each task's result)" in out
    replay.events = [ev("playbook_on_play_start"), ev("playbook_on_play_start"),
                     ev("playbook_on_stats", ok={h: 1 for h in HOSTS})]
    code, out, _ = provision(clusterctl, virtual_inventory, tmp_path, "--check", "--diff")
    assert "diff: no file would change" in out


def test_unknown_tag_is_an_error_listing_the_tags(clusterctl, virtual_inventory, tmp_path, replay):
    code, out, err = provision(clusterctl, virtual_inventory, tmp_path, "--tags", "chrny")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert err.startswith("error: --tags: unknown tag 'chrny'; did you mean 'chrony'? (known: chrony, consul_agent,")
    assert not replay.calls  # nothing ran
    code, _, err = provision(clusterctl, virtual_inventory, tmp_path, "--tags", "nosuchtag", "--plan")
    assert code == 2 and "unknown tag 'nosuchtag'" in err


def test_a_tag_of_a_playbook_without_tags_says_it_has_none(clusterctl, virtual_inventory, tmp_path, replay):
    code, out, err = provision(clusterctl, virtual_inventory, tmp_path, "--playbook", "rolling-restart.yml",
                               "--tags", "chrony", "--plan")
    assert (code, out) == (2, "")
    assert one_line(err) == ("error: --tags: unknown tag 'chrony': rolling-restart.yml declares no tags "
                             "(run it without --tags)")


def test_limit_matching_nothing_names_the_groups(clusterctl, virtual_inventory, tmp_path, replay):
    code, _, err = provision(clusterctl, virtual_inventory, tmp_path, "--limit", "r09n01", "--plan")
    assert code == 2 and err.count("\n") == 1
    assert (f"error: --limit 'r09n01' matches no host in {virtual_inventory}; did you mean 'r02n01'? (groups: "
            "balancers, consul_servers, edges, rack_r01, rack_r02") in err
    assert "hosts=None" not in err and "WARNING" not in err


def test_mask_secrets_keeps_the_key_and_hides_the_value():
    text = "+consul_token = abc\n-  password: hunter2\n+pool x iburst\n+  \"api_key\": \"k\""
    assert mask_secrets(text).splitlines() == [
        "+consul_token = ********", "-  password: ********", "+pool x iburst", '+  "api_key": ********']


def test_provision_writes_nothing_beside_the_machines(clusterctl, brought_up_inventory, tmp_path, replay,
                                                     monkeypatch):
    """Production keeps no simulator record: the fact "provisioned" is the machines' own stamp."""
    from sim.hosts import lifecycle

    monkeypatch.chdir(tmp_path)
    replay.events, replay.rc = GOOD_EVENTS, 0
    state = lifecycle.state_dir(brought_up_inventory)
    before = sorted(state.rglob("*"))
    for args in (("--check",), ()):
        assert provision(clusterctl, brought_up_inventory, tmp_path, *args)[0] == 0
    assert sorted(state.rglob("*")) == before == []
    assert not (tmp_path / ".state" / "inventories").exists()


def test_virtual_up_reads_the_machines_stamp_from_any_directory(clusterctl, brought_up_inventory, tmp_path,
                                                               monkeypatch):
    """A cluster provisioned from one directory is not wiped by `virtual up` from another: the stamp is in the
    machine, not under a current directory."""
    from sim.hosts import lifecycle
    from sim.hosts.machines import MachineState

    there = tmp_path / "there"
    there.mkdir()
    stamp_provisioned(brought_up_inventory, "r01n01")
    monkeypatch.chdir(there)
    monkeypatch.setattr(lifecycle, "status", lambda inv: [MachineState("r01n01", "running", [], "127.0.1.11")])
    monkeypatch.setattr(lifecycle, "up", lambda *args: pytest.fail("the provisioned machines were replaced"))
    code, _, err = clusterctl("virtual", "up", "-i", str(brought_up_inventory))
    assert code == 2 and "up and provisioned at" in err
    assert not (there / ".state").exists()


def test_provisioning_an_inventory_without_machines_creates_no_state_dir(clusterctl, virtual_inventory, tmp_path,
                                                                         replay, monkeypatch):
    from sim.hosts import lifecycle

    monkeypatch.chdir(tmp_path)
    replay.events, replay.rc = GOOD_EVENTS, 0
    assert provision(clusterctl, virtual_inventory, tmp_path)[0] == 0
    assert not lifecycle.state_dir(virtual_inventory).exists()
    assert not (tmp_path / ".state" / "inventories").exists()


def test_a_limit_part_matching_nothing_is_an_error_too(clusterctl, virtual_inventory, tmp_path, replay):
    # `--limit r01n01,r0n02` ran on r01n01 alone and said nothing of the typo (Ansible's own warning is off)
    code, out, err = provision(clusterctl, virtual_inventory, tmp_path, "--limit", "r01n01,r0n02")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith(f"error: --limit 'r01n01,r0n02': 'r0n02' matches no host in {virtual_inventory}; did you "
                          "mean 'r02n02'? (groups: ")
    assert not replay.calls  # nothing ran
    # exclusions, intersections and patterns that match keep working
    code, out, _ = provision(clusterctl, virtual_inventory, tmp_path, "--limit", "rack_r01:!r01n02:&all", "--plan")
    assert code == 0 and "on 1 host" in out
    code, out, _ = provision(clusterctl, virtual_inventory, tmp_path, "--limit", "r0*n01,rack_r02", "--plan")
    assert code == 0 and "on 3 hosts" in out


def test_a_run_dir_inside_the_inventory_directory_is_refused_before_anything_runs(
        clusterctl, virtual_inventory, replay):
    """Ansible reads every file under an inventory directory (names starting with a dot aside): the run's
    artifacts there would be parsed as inventory by the next run."""
    inside = virtual_inventory / "runs" / "today"
    code, out, err = clusterctl("provision", "-i", str(virtual_inventory), "--run-dir", str(inside))
    assert (code, out) == (2, "")
    assert one_line(err) == (f"error: --run-dir {inside.resolve()} is inside the inventory directory "
                             f"{virtual_inventory.resolve()}: Ansible would read the run's files as inventory; "
                             "choose a directory outside it, or one whose name starts with a dot")
    assert not replay.calls and not inside.exists()
    # a hidden directory inside it is what the default (.state/runs) is, run from the inventory directory
    replay.events, replay.rc = GOOD_EVENTS, 0
    code, _, _ = clusterctl("provision", "-i", str(virtual_inventory), "--run-dir", str(virtual_inventory / ".state" / "r"),
                            "--yes")
    assert code == 0 and replay.calls


def test_plan_names_each_play_its_batching_and_roles(clusterctl, virtual_inventory, tmp_path):
    code, out, err = clusterctl("provision", "-i", str(virtual_inventory), "--plan", "--batches", "1,50%",
                                "--run-dir", str(tmp_path / "run"), columns=160)
    assert code == 0, err
    lines = [line.rstrip() for line in out.splitlines()]
    assert lines[1:10] == [
        "Consul servers: r01n01 (runs IUs: consul_servers_running_ius)",
        "play 1: Start the Consul servers together, all at once", "  roles: consul_agent",
        "play 2: Time sync and the host firewall on the dedicated Consul servers, one at a time (no host of this "
        "run)", "  roles: chrony -> host_firewall",
        "play 3: Provision GPU inference nodes, batches 1,50%",
        "  roles: cpu_cstates -> numa_tuning -> nvidia_stack -> rdma_network -> chrony -> inference_unit -> "
        "consul_agent -> eas_agent -> host_firewall",
        "play 4: Edges, one at a time", "  roles: eas_edge"]
    # a play's name that already says how it batches is not followed by the same words again
    assert lines[lines.index("play 6: Reboot the Consul servers one at a time") + 1] == (
        "  roles: none (the play's own tasks)")
    assert not (tmp_path / "run").exists()


def test_plan_as_json_is_the_plan_and_json_needs_plan(clusterctl, virtual_inventory):
    import json as json_module

    code, out, _ = clusterctl("provision", "-i", str(virtual_inventory), "--plan", "--json", "--limit", "r01n01")
    assert code == 0
    plan = json_module.loads(out)
    assert plan["limit"] == "r01n01" and plan["batches"] and all(b == ["r01n01"] for b in plan["batches"])
    assert [p["name"] for p in plan["plays"]][:1] == ["Start the Consul servers together"]
    code, _, err = clusterctl("provision", "-i", str(virtual_inventory), "--json")
    assert code == 2 and "--json prints the plan: use it with --plan" in err


def test_a_mistyped_playbook_is_named_with_its_near_miss_and_the_list(clusterctl, virtual_inventory):
    code, _, err = clusterctl("provision", "-i", str(virtual_inventory), "--playbook", "rolling-restrat.yml", "--plan")
    assert code == 2 and "did you mean 'rolling-restart.yml'? (playbooks: consul-servers-reboot.yml" in err
    assert "site.yml" in err


def whole_inventory(clusterctl, inventory, tmp_path, *args):
    return clusterctl("provision", "-i", str(inventory), "--batches", "1,100%", "--run-dir", str(tmp_path / "run"),
                      *args)


def test_no_limit_and_no_terminal_is_refused_before_any_host_is_contacted(clusterctl, virtual_inventory, tmp_path,
                                                                          replay, monkeypatch):
    monkeypatch.chdir(tmp_path)
    replay.calls = []
    code, out, err = whole_inventory(clusterctl, virtual_inventory, tmp_path)
    assert code == 2 and out == "" and replay.calls == [] and not (tmp_path / "run").exists()
    assert one_line(err) == (
        f"error: no --limit: this would run site.yml on all 4 hosts of {virtual_inventory} in 7 batches, and there "
        "is no terminal to confirm it; pass --yes to run it on every host, or --limit PATTERN for fewer (--plan "
        "shows the batches)")
    code, _, _ = whole_inventory(clusterctl, virtual_inventory, tmp_path, "--yes")
    assert code == 1 and len(replay.calls) == 1  # the replayed run (a failed host), not refused


def test_a_terminal_is_asked_naming_hosts_and_batches_and_no_runs_nothing(clusterctl, virtual_inventory, tmp_path,
                                                                          replay, monkeypatch):
    import io
    import sys

    from cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(app, "stdin_is_terminal", lambda: True)
    replay.calls = []
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    code, out, err = whole_inventory(clusterctl, virtual_inventory, tmp_path)
    question = f"no --limit: run site.yml on all 4 hosts of {virtual_inventory} in 7 batches? [y/N]: "
    assert code == 2 and replay.calls == [] and not (tmp_path / "run").exists()
    assert err == question + "error: not confirmed: no host was contacted\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    code, out, err = whole_inventory(clusterctl, virtual_inventory, tmp_path)
    assert err.startswith(question) and code == 1 and len(replay.calls) == 1 and "r01n02" in out


def test_a_limit_a_check_run_or_a_plan_never_asks(clusterctl, virtual_inventory, tmp_path, replay, monkeypatch):
    monkeypatch.chdir(tmp_path)
    replay.calls = []
    for args in (["--limit", "r01n01"], ["--check"]):
        code, _, err = whole_inventory(clusterctl, virtual_inventory, tmp_path / args[0].strip("-"), *args)
        assert "no --limit" not in err and code == 1
    assert len(replay.calls) == 2
    code, out, _ = whole_inventory(clusterctl, virtual_inventory, tmp_path, "--plan")
    assert code == 0 and out.startswith("plan: site.yml on 4 hosts")
