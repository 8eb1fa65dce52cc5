"""The remediation ladder over a scripted host and an in-memory Consul: the plan, the rungs in order, each one
verified, escalation when the unit stays unhealthy, stop on a step that cannot run, whose maintenance is
cleared, the repair rung and its breaker, Ctrl-C."""

from __future__ import annotations

import json

import pytest

from cluster.model import build_cluster
from consul_io import layout
from operate.drill_faults import Target
from operate.remediate import RUNNING, Remediation
from operate.remediate_breaker import Limits
from operate.remediate_reboot import RebootRun
from preflight.transport import CommandResult

pytestmark = pytest.mark.unit

CLUSTER = build_cluster({f"n{n}": {"ansible_host": f"127.0.73.{n}", "rack": "r1", "gpu_model": "h100-sxm",
                                   "gpu_count": 8, "iu_size": 4} for n in (1, 2, 3)})
NODE = CLUSTER.node("n1")
TARGET = Target(NODE, NODE.ius[1])  # GPUs 4-7, port 8001
UNIT = "vllm-iu@1.service"


class Host:
    """Answers argv by its first words (exit code, stdout); ``is-active`` of a unit in ``services`` answers from
    it, of any other unit ``active`` from the moment ``active_after`` commands matching it have run; records
    every command."""

    def __init__(self, answers=None, active_after: tuple[str, ...] | None = ("systemctl", "restart"),
                 services: dict[str, bool] | None = None):
        self.answers = answers or {}
        self.active_after = active_after
        self.active = False
        self.services = {"nvidia-fabricmanager.service": True, **(services or {})}
        self.calls: list[tuple[str, ...]] = []

    def run(self, host, argv, timeout):
        argv = tuple(argv)
        self.calls.append(argv)
        if argv[:2] == ("systemctl", "is-active"):
            active = self.services.get(argv[2], self.active)
            return CommandResult(0 if active else 3, "active\n" if active else "inactive\n", "", 0.01)
        rc, out = next((a for p, a in self.answers.items() if argv[:len(p)] == p), (0, ""))
        if rc is None:
            return CommandResult(None, "", "ssh: connect to host 127.0.73.1 port 22: No route to host", 0.01,
                                 unreachable=True)
        if rc == 0 and self.active_after and argv[:len(self.active_after)] == self.active_after:
            self.active = True
        return CommandResult(rc, out, "" if rc == 0 else "nvidia-smi: GPU reset failed", 0.01)


class Consul:
    """health/service/vllm-iu, agent service maintenance and KV puts, in memory."""

    def __init__(self, maintenance: dict[str, str] | None = None, lists_maintenance: bool = True):
        self.maintenance = dict(maintenance or {})
        self.lists_maintenance = lists_maintenance
        self.kv: dict[str, str] = {}
        self.calls: list[tuple] = []

    def health_service(self, index=None, wait_s=None, passing=False):
        entries = []
        for iu in CLUSTER.ius():
            checks = [{"CheckID": "serfHealth", "Status": "passing"}]
            if iu.id in self.maintenance and self.lists_maintenance:
                checks.append({"CheckID": layout.maintenance_check(iu.id), "Status": "critical",
                               "Notes": self.maintenance[iu.id]})
            entries.append({"Service": {"ID": iu.id}, "Checks": checks})
        return 1, entries

    def service_maintenance(self, service_id, enable, reason=""):
        self.calls.append((service_id, enable, reason))
        if enable:
            self.maintenance[service_id] = reason
        else:
            self.maintenance.pop(service_id, None)

    def kv_put(self, key, value):
        self.kv[key] = value
        return True

    def kv_read(self, key):
        return (1, self.kv[key]) if key in self.kv else (0, None)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def sleep(self, seconds):
        self.t += seconds


def ladder(host: Host, consul: Consul, healthy=lambda: True, running=lambda: 0.0, **kwargs) -> Remediation:
    clock = Clock()
    return Remediation(CLUSTER, TARGET, host, consul, verify_s=10, settle_s=3, drain_s=5, probe=lambda url: healthy(),
                       running=lambda url: running(), clock=clock, sleep=clock.sleep, **kwargs)


RESTART = [("systemctl", "reset-failed", UNIT), ("systemctl", "restart", UNIT)]
PERSISTENCE = ("nvidia-smi", "--query-gpu=index,pci.bus_id,persistence_mode", "--format=csv,noheader", "-i", "4,5,6,7")
# Fabric Manager active on an H100 board: the unit's four GPUs in one command (nvidia-smi(1)); the agent holds
# NVML handles, persistence mode holds the GPUs: both off for the reset, both back after
RESET = [("systemctl", "stop", UNIT), ("systemctl", "stop", "eas-agent.service"), PERSISTENCE,
         ("nvidia-smi", "-pm", "0", "-i", "4,5,6,7"), ("nvidia-smi", "--gpu-reset", "-i", "4,5,6,7"),
         ("nvidia-smi", "-pm", "1", "-i", "4,5,6,7"), ("systemctl", "start", "eas-agent.service"),
         ("nvidia-smi", "-q", "-i", "4,5,6,7"), ("systemctl", "reset-failed", UNIT), ("systemctl", "start", UNIT)]
PM_ON = ("4, 00000000:9A:00.0, Enabled\n5, 00000000:AB:00.0, Enabled\n6, 00000000:BA:00.0, Enabled\n"
         "7, 00000000:DB:00.0, Enabled\n")


def gpu_host(answers=None, **kwargs) -> Host:
    """A host whose agent runs and whose GPUs are in persistence mode (roles/nvidia_stack's daemons)."""
    return Host({PERSISTENCE: (0, PM_ON), **(answers or {})},
                services={"eas-agent.service": True, "nvidia-dcgm.service": False, **kwargs.pop("services", {})},
                **kwargs)


def actions(host: Host) -> list[tuple[str, ...]]:
    return [c for c in host.calls if c[:2] != ("systemctl", "is-active")]


def test_the_plan_names_every_rung_from_the_start_and_touches_nothing():
    host, consul = Host(), Consul()
    plan = ladder(host, consul, start="gpu_reset", reason="XID 48").plan()
    assert plan == [
        "breaker: at most 10% of the units and 1 node(s) per rack out of rotation, judged from Consul",
        "first rung: named by the operator (--from)",
        "drain: n1-iu1 into Consul maintenance (clusterctl remediate: XID 48); verified listed within 3 s; then up "
        "to 5 s for its requests in flight to finish",
        "gpu_reset: on n1: GPUs 4,5,6,7 alone if nvidia-fabricmanager.service is active, else every GPU of the "
        "NVSwitch board (every unit of n1 drained, the breaker judged for the node); the units stopped, "
        "eas-agent.service and nvidia-dcgm.service stopped and persistence mode off, nvidia-smi --gpu-reset, all put "
        "back, every reset GPU's fabric Completed + Success within 180 s (nvidia-smi -q; a GPU without one is not "
        "waited for), the units started; a reset nvidia-smi refuses or a fabric not back goes to the next rung; "
        "healthy when active and "
        "http://127.0.73.1:8001/health answers 200 within 10 s, else the next rung",
        "reboot: the breaker judged for the whole node; playbooks/node-reboot.yml --limit n1 (every unit of n1 "
        "drained by Consul node maintenance, the reboot, the driver checked, the units that served released); "
        "healthy when active and http://127.0.73.1:8001/health answers 200 within 10 s, else the next rung",
        "repair: every unit of n1 into maintenance (node marked for repair), the record clusterctl/repair/dc1/n1; "
        "the breaker judged for the whole node",
        "release: n1-iu1's maintenance off (only one this command set)"]
    assert host.calls == [] and consul.calls == []


def test_a_restart_that_brings_the_unit_back_drains_it_first_and_releases_it_after():
    host, consul = Host(), Consul()
    outcome = ladder(host, consul, reason="engine crashed").run()
    assert outcome.state == "released" and outcome.ok, outcome.message
    assert actions(host) == RESTART
    assert consul.calls == [("n1-iu1", True, "clusterctl remediate: engine crashed"), ("n1-iu1", False, "")]
    assert [s.rung for s in outcome.steps] == ["drain", "restart", "verify restart", "release"]
    assert outcome.left == ["n1-iu1: serving, in rotation"] and outcome.healthy_s is not None


def test_the_restart_waits_for_the_requests_in_flight_and_goes_ahead_after_the_bound():
    host, consul = Host(), Consul()
    left = iter([3.0, 2.0, 0.0, 1.0, 0.0, 0.0])  # idle only on two readings in a row
    outcome = ladder(host, consul, running=lambda: next(left)).run()
    assert outcome.steps[0].did == ["n1-iu1 in maintenance, listed after 0.0 s", "nothing in flight after 2.5 s"]
    stuck = ladder(Host(), Consul(), running=lambda: 1.0).run()
    assert stuck.state == "released"
    assert stuck.steps[0].did[1] == "requests still in flight after 5 s: going ahead (rolling-restart.yml does too)"


def test_in_flight_sums_vllms_gauge_over_its_labels():
    text = ("# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0",model_name="llama"} 2.0\n'
            'vllm:num_requests_running{engine="1",model_name="llama"} 1.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="llama"} 7.0\n')
    assert sum(float(v) for v in RUNNING.findall(text)) == 3.0


def test_a_unit_still_unhealthy_after_the_restart_gets_its_gpus_reset():
    host = gpu_host(active_after=("systemctl", "start", UNIT))  # the restarted engine dies again; reset, it serves
    consul = Consul()
    outcome = ladder(host, consul).run()
    assert outcome.state == "released", outcome.message
    assert actions(host) == RESTART + RESET
    assert [(s.rung, s.ok) for s in outcome.steps] == [
        ("drain", True), ("restart", True), ("verify restart", False), ("gpu_reset", True), ("verify gpu_reset", True),
        ("release", True)]
    assert outcome.steps[2].detail == "not healthy within 10 s: the next rung"


def test_an_active_unit_whose_health_fails_is_not_healthy():
    host, consul = gpu_host(), Consul()
    rebooted = []
    outcome = ladder(host, consul, healthy=lambda: False, start="gpu_reset", limits=Limits(0.5),
                     reboot=lambda node, why: rebooted.append(node) or RebootRun(True, [f"{node} rebooted"])).run()
    assert outcome.state == "repair" and not outcome.ok
    assert [s.rung for s in outcome.steps] == ["drain", "gpu_reset", "verify gpu_reset", "reboot", "verify reboot",
                                               "repair"]
    assert rebooted == ["n1"]


def test_a_reset_nvidia_smi_cannot_run_stops_the_ladder_with_the_unit_stopped_and_drained():
    host = gpu_host({PERSISTENCE: (127, "")}, active_after=None)  # no nvidia-smi on the host
    consul = Consul()
    outcome = ladder(host, consul).run()
    assert outcome.state == "stopped"
    assert outcome.message.startswith(f"gpu_reset could not be carried out: n1: `{' '.join(PERSISTENCE)}` exited 127")
    # nothing reset, and what the reset step stopped besides the unit is started again
    assert actions(host) == RESTART + RESET[:3] + [("systemctl", "start", "eas-agent.service")]
    assert consul.maintenance == {"n1-iu1": "clusterctl remediate: unhealthy"} and consul.kv == {}
    assert outcome.left == [f"n1-iu1: in maintenance (out of rotation); {UNIT} stopped; clear it with "
                            "`clusterctl preflight --release` once the unit is fixed"]


def test_an_unreachable_host_stops_at_the_first_command():
    host, consul = Host({("systemctl", "reset-failed"): (None, "")}), Consul()
    outcome = ladder(host, consul).run()
    assert outcome.state == "stopped" and "unreachable" in outcome.message
    assert actions(host) == RESTART[:1] and "n1-iu1" in consul.maintenance


def test_someone_elses_maintenance_is_left_on_a_previous_remediations_is_cleared():
    host = Host()
    theirs = Consul({"n1-iu1": "rack r1 cabling work"})
    outcome = ladder(host, theirs).run()
    assert outcome.state == "released" and theirs.calls == []
    assert outcome.steps[0].did == ["already in maintenance (rack r1 cabling work): someone else's, left on at the end",
                                    "nothing in flight after 0.5 s"]
    assert outcome.steps[-1].did == ["n1-iu1's maintenance is someone else's: left on"]
    ours = Consul({"n1-iu1": "clusterctl remediate: XID 13"})
    assert ladder(Host(), ours).run().state == "released" and ours.calls == [("n1-iu1", False, "")]


def test_a_maintenance_consul_never_lists_stops_before_any_host_command():
    host, consul = Host(), Consul(lists_maintenance=False)
    outcome = ladder(host, consul).run()
    assert outcome.state == "stopped" and host.calls == []
    assert outcome.message == "drain: n1-iu1's maintenance was not listed by Consul within 3 s"


def test_the_repair_rung_takes_every_unit_of_the_node_out_and_records_what_was_tried():
    host, consul = Host(), Consul()
    outcome = ladder(host, consul, start="repair", reason="XID 79", limits=Limits(0.5)).run()
    assert outcome.state == "repair" and host.calls == []
    assert consul.maintenance == {"n1-iu1": "clusterctl remediate: XID 79",
                                  "n1-iu0": "clusterctl remediate: node marked for repair: n1-iu1 XID 79"}
    record = json.loads(consul.kv["clusterctl/repair/dc1/n1"])
    assert record["iu"] == "n1-iu1" and record["reason"] == "XID 79" and record["steps"][0].startswith("drain: ok")
    assert outcome.left == ["n1: every unit in maintenance, marked for repair (clusterctl/repair/dc1/n1)"]


def test_the_breaker_is_judged_again_for_the_whole_node_before_the_repair():
    host, consul = Host(), Consul()
    outcome = ladder(host, consul, start="repair").run()  # 6 units, 10%: one unit, but the node holds two
    assert outcome.state == "breaker" and [v.open for v in outcome.verdicts] == [False, True]
    assert consul.maintenance == {"n1-iu1": "clusterctl remediate: unhealthy"} and consul.kv == {}
    assert outcome.left[0].startswith("n1-iu1: in maintenance (out of rotation); clear it")


def test_an_open_breaker_touches_nothing():
    host, consul = Host(), Consul({"n2-iu0": "clusterctl remediate: earlier"})
    outcome = ladder(host, consul).run()
    assert outcome.state == "breaker" and host.calls == [] and consul.calls == []
    assert outcome.left == ["n1-iu1: untouched (not drained)"]


def test_ctrl_c_leaves_the_unit_drained_and_says_so():
    host, consul = Host(), Consul()

    def interrupt():
        raise KeyboardInterrupt

    outcome = ladder(host, consul, healthy=interrupt).run()
    assert outcome.state == "interrupted" and outcome.message == "interrupted: nothing is undone"
    assert "n1-iu1" in consul.maintenance and outcome.left[0].startswith("n1-iu1: in maintenance")


def test_a_node_marked_for_repair_is_refused_before_anything_is_touched():
    host, consul = Host(), Consul()
    assert ladder(host, consul, start="repair", limits=Limits(0.5)).run().state == "repair"
    calls = list(consul.calls)
    again = ladder(host, consul).run()  # its units' maintenance stays the repair's
    assert again.state == "refused" and not again.ok and host.calls == [] and consul.calls == calls
    assert again.message.startswith("n1 is marked for repair (clusterctl/repair/dc1/n1): delete the record once")
    assert again.left == ["n1-iu1: untouched"]


def score_body(xid: int) -> str:
    return json.dumps({"node": "n1", "ts": 1.0, "ius": {"n1-iu1": {
        "score": None, "status": "critical", "components": {"xid_events": 1, "xid_last": xid}}}})


def test_without_a_named_rung_the_units_latest_xid_picks_the_first_one():
    host, consul = gpu_host(active_after=("systemctl", "start", UNIT)), Consul()
    consul.kv[layout.score_key("dc1", "n1")] = score_body(95)  # uncontained memory error: NVIDIA's RESET_GPU
    remediation = ladder(host, consul)
    plan = remediation.plan()
    assert plan[1].startswith("first rung: from the XID catalogue: gpu_reset: xid_last 95 in its score body (1 events): "
                              "XID 95 ROBUST_CHANNEL_UNCONTAINED_ERROR, NVIDIA's immediate action RESET_GPU")
    assert [line.split(":")[0] for line in plan[3:]] == ["gpu_reset", "reboot", "repair", "release"]
    outcome = remediation.run()
    assert outcome.state == "released" and actions(host) == RESET  # no restart first: it cannot clear a GPU fault
    assert outcome.as_dict()["start"] == "gpu_reset"


def test_an_xid_older_than_the_window_no_longer_picks_the_first_rung():
    host, consul = Host(), Consul()
    consul.kv[layout.score_key("dc1", "n1")] = json.dumps({"node": "n1", "ts": 10_000.0, "ius": {"n1-iu1": {
        "score": None, "status": "critical", "components": {"xid_events": 1, "xid_last": 79, "xid_last_at": 6_000.0}}}})
    old = ladder(host, consul)
    old.wall_clock = lambda: 10_010.0
    assert old.choose_start() == "restart" and "xid_last 79 was received 4010 s ago, more than 3600 s" in old.start_why
    young = ladder(host, consul)
    young.wall_clock, young.xid_max_age_s = (lambda: 10_010.0), 5000.0
    assert young.choose_start() == "reboot" and "received 4010 s ago" in young.start_why
    assert host.calls == []


def test_a_unit_without_an_xid_starts_at_the_restart():
    host, consul = Host(), Consul()
    outcome = ladder(host, consul).run()
    assert outcome.start == "restart" and outcome.start_why == (
        "from the XID catalogue: restart: no score body for its node in Consul")


def test_a_gpu_fallen_off_the_bus_reboots_the_node_then_verifies_the_unit():
    host, consul = Host(active_after=None), Consul()
    consul.kv[layout.score_key("dc1", "n1")] = score_body(79)
    reboots = []

    def reboot(node, why):
        reboots.append((node, why))
        host.active = True  # the unit starts with the node
        return RebootRun(True, ["ansible-playbook node-reboot.yml --limit n1", "n1 rebooted"])

    outcome = ladder(host, consul, reboot=reboot, limits=Limits(0.5), reason="XID 79").run()
    assert outcome.state == "released", outcome.message
    assert [(s.rung, s.ok) for s in outcome.steps] == [("drain", True), ("reboot", True), ("verify reboot", True),
                                                       ("release", True)]
    assert reboots == [("n1", "clusterctl remediate: n1-iu1 XID 79")] and actions(host) == []
    assert len(outcome.verdicts) == 2  # before the drain, and before the reboot takes the whole node out
    assert consul.maintenance == {}


def test_the_breaker_judges_the_whole_node_before_a_reboot():
    host, consul = Host(active_after=None), Consul()
    consul.kv[layout.score_key("dc1", "n1")] = score_body(79)
    reboots = []
    outcome = ladder(host, consul, reboot=lambda node, why: reboots.append(node)).run()  # 6 units, 10%: one
    assert outcome.state == "breaker" and reboots == []
    assert [s.rung for s in outcome.steps] == ["drain"]
    assert outcome.left[0].startswith("n1-iu1: in maintenance (out of rotation)")


def test_a_reboot_that_cannot_be_carried_out_stops_the_ladder_short_of_the_repair():
    host, consul = Host(active_after=None), Consul()
    refused = "n1: Reboot the host: Running ansible.builtin.reboot with local connection would reboot the control node"
    outcome = ladder(host, consul, start="reboot", limits=Limits(0.5),
                     reboot=lambda node, why: RebootRun(False, ["ansible-playbook node-reboot.yml --limit n1"],
                                                        refused)).run()
    assert outcome.state == "stopped" and outcome.message == f"reboot could not be carried out: {refused}"
    assert [(s.rung, s.ok) for s in outcome.steps] == [("drain", True), ("reboot", False)]
    assert consul.kv == {} and "n1-iu1" in consul.maintenance  # not marked for repair; still drained
    nothing = ladder(Host(), Consul(), start="reboot", limits=Limits(0.5)).run()  # no playbook runner given
    assert nothing.state == "stopped" and nothing.message.endswith("no inventory to run the reboot playbook with")
