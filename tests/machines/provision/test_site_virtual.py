"""site.yml for real on simulated hosts: rendered files, idempotence, check mode, plan, failing batches.

One provisioned cluster per module (see conftest.py): r01n01 and r01n02 on InfiniBand (r01n02 with
56-core sockets), r02n01 on RoCE.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from cluster import load_cluster
from eas_agent.config import parse_config
from eas_wire.signing import parse_public_keys
from sim.aptrepo.catalog import DRIVER_BRANCH, DRIVER_VERSIONS
from tests.helpers.devconsul import wait_until
from tests.helpers.provision import NCCL_TESTS_BIN, TOKEN, ansible_playbook, clusterctl, stats_of

# The module's fixture provisions 3 simulated hosts four times (check, first run, reboot, rerun): ~3.5 CPU-minutes,
# far more wall time when other work shares the 2 cores.
pytestmark = [pytest.mark.machines(order=9), pytest.mark.timeout(1800)]

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden" / "provision"
IB_HOST, OTHER_TOPOLOGY_HOST, ROCE_HOST = "r01n01", "r01n02", "r02n01"
FM, OLD_FM = f"nvidia-fabricmanager-{DRIVER_BRANCH}", f"{DRIVER_VERSIONS[1]}-1"  # the stand-in repo's older FM
CUDA_LIST = "/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list"  # what the stand-in cuda-keyring ships, as NVIDIA's


def golden(name: str) -> str:
    return (GOLDEN / name).read_text()


# consul.hcl's secrets are fresh on every `virtual create` (gossip key, ACL tokens): the golden holds their
# places; that each is the inventory's own is test_consul_acl's and the agents' business.
SECRET_HCL = re.compile(r'^(\s*(?:encrypt|initial_management|agent|config_file_service_registration)\s*=\s*)"[^"]*"$',
                        re.MULTILINE)


def masked(name: str, text: str) -> str:
    if name == "eas-agent-edge-keys.pub":  # the key pair is drawn with the inventory
        return re.sub(r"(?m)^\S+ (\S+)$", r"<public key> \1", text)
    return SECRET_HCL.sub(r'\1"<secret>"', text) if name == "consul.hcl" else text


# Every config file a role renders from a template, as one host has it after the first run: (host, path on
# the host, golden file). test_every_template_has_a_golden keeps the table complete.
RENDERED = [
    (IB_HOST, "/etc/nccl.conf", "nccl-ib.conf"),
    (ROCE_HOST, "/etc/nccl.conf", "nccl-roce.conf"),
    (IB_HOST, "/etc/apt/preferences.d/clusterctl-nvidia.pref", "apt-pin.pref"),
    (IB_HOST, "/etc/systemd/system/nvidia-persistenced.service.d/10-clusterctl-persistence.conf",
     "nvidia-persistenced-10-clusterctl-persistence.conf"),
    (IB_HOST, "/etc/vllm-iu/0.env", "vllm-iu-r01n01-0.env"),
    (IB_HOST, "/etc/systemd/system/vllm-iu@.service", "vllm-iu@.service"),
    (IB_HOST, "/etc/systemd/system/vllm-iu@1.service.d/10-numa.conf", "vllm-iu@1-10-numa-r01n01.conf"),
    (IB_HOST, "/etc/eas-agent/config.yml", "eas-agent-config-r01n01.yml"),
    (IB_HOST, "/etc/systemd/system/eas-agent.service", "eas-agent.service"),
    (IB_HOST, "/etc/eas-agent/edge-keys.pub", "eas-agent-edge-keys.pub"),
    (IB_HOST, "/etc/consul.d/vllm-iu-r01n01-iu0.json", "consul-vllm-iu-r01n01-iu0.json"),
    (IB_HOST, "/etc/sysctl.d/60-clusterctl-numa.conf", "sysctl-60-clusterctl-numa.conf"),
    (IB_HOST, "/etc/chrony/chrony.conf", "chrony.conf"),
    (IB_HOST, "/etc/default/grub.d/60-clusterctl-cstates.cfg", "grub-cstates-intel.cfg"),
    (IB_HOST, "/etc/systemd/system/cpu-dma-latency.service", "cpu-dma-latency.service"),
    (ROCE_HOST, "/etc/systemd/system/roce-dcqcn.service", "roce-dcqcn.service"),
    (ROCE_HOST, "/usr/local/sbin/roce-dcqcn", "roce-dcqcn.sh"),
    (IB_HOST, "/etc/consul.d/consul.hcl", "consul.hcl"),
    (IB_HOST, "/etc/clusterctl/firewall.nft", "host-firewall-r01n01.nft"),
    (IB_HOST, "/etc/systemd/system/clusterctl-firewall.service", "clusterctl-firewall.service"),
    (IB_HOST, "/etc/eas-edge/edge.yml", "eas-edge-config-r01n01.yml"),
    (IB_HOST, "/etc/systemd/system/eas-edge.service", "eas-edge.service"),
    (IB_HOST, "/etc/consul.d/eas-edge.json", "consul-eas-edge-r01n01.json"),
    (IB_HOST, "/etc/haproxy/haproxy.cfg", "haproxy.cfg"),
]
# Template -> golden file(s) of RENDERED. consul.hcl holds the virtual inventory's secrets, which are test
# values committed in inventory/virtual (never a real cluster's).
TEMPLATE_GOLDENS = {
    "nvidia_stack/nccl.conf.j2": ("nccl-ib.conf", "nccl-roce.conf"),
    "nvidia_stack/apt-pin.pref.j2": ("apt-pin.pref",),
    "nvidia_stack/persistenced.conf.j2": ("nvidia-persistenced-10-clusterctl-persistence.conf",),
    "inference_unit/iu.env.j2": ("vllm-iu-r01n01-0.env",),
    "inference_unit/vllm-iu@.service.j2": ("vllm-iu@.service",),
    "inference_unit/numa.conf.j2": ("vllm-iu@1-10-numa-r01n01.conf",),
    "eas_agent/config.yml.j2": ("eas-agent-config-r01n01.yml",),
    "eas_agent/eas-agent.service.j2": ("eas-agent.service",),
    "eas_agent/edge-keys.pub.j2": ("eas-agent-edge-keys.pub",),
    "consul_agent/iu-service.json.j2": ("consul-vllm-iu-r01n01-iu0.json",),
    "numa_tuning/sysctl.conf.j2": ("sysctl-60-clusterctl-numa.conf",),
    "chrony/chrony.conf.j2": ("chrony.conf",),
    "cpu_cstates/grub-cstates.cfg.j2": ("grub-cstates-intel.cfg",),
    "cpu_cstates/pm-qos.service.j2": ("cpu-dma-latency.service",),
    "rdma_network/roce-dcqcn.service.j2": ("roce-dcqcn.service",),
    "rdma_network/roce-dcqcn.sh.j2": ("roce-dcqcn.sh",),
    "consul_agent/consul.hcl.j2": ("consul.hcl",),
    "host_firewall/firewall.nft.j2": ("host-firewall-r01n01.nft",),
    "host_firewall/clusterctl-firewall.service.j2": ("clusterctl-firewall.service",),
    "eas_edge/edge.yml.j2": ("eas-edge-config-r01n01.yml",),
    "eas_edge/eas-edge.service.j2": ("eas-edge.service",),
    "eas_edge/edge-service.json.j2": ("consul-eas-edge-r01n01.json",),
    "edge_balancer/haproxy.cfg.j2": ("haproxy.cfg",),
}
NO_GOLDEN_YET: set[str] = set()
# Templates the site cluster renders nothing from (its inventory sets no client keys): their golden is the
# roles' own render test's (tests/integration/roles/test_edge_roles.py).
GOLDEN_FROM_ROLE_TESTS = {"eas_edge/api-keys.j2": "eas-edge-api-keys"}
# CLUSTERCTL_WRITE_MISSING_GOLDEN=1 writes a golden file that does not exist yet from the host (to be
# reviewed like code before it is committed); an existing golden is never rewritten.
WRITE_MISSING = os.environ.get("CLUSTERCTL_WRITE_MISSING_GOLDEN") == "1"


def test_every_template_has_a_golden():
    roles = Path(__file__).resolve().parents[3] / "roles"
    templates = {p.relative_to(roles).as_posix().replace("/templates/", "/") for p in roles.glob("*/templates/*.j2")}
    assert templates == set(TEMPLATE_GOLDENS) | NO_GOLDEN_YET | set(GOLDEN_FROM_ROLE_TESTS)
    assert all((GOLDEN / name).is_file() for name in GOLDEN_FROM_ROLE_TESTS.values())
    assert {name for names in TEMPLATE_GOLDENS.values() for name in names} == {name for _, _, name in RENDERED}


@pytest.mark.parametrize(("host", "path", "name"), RENDERED, ids=[name for _, _, name in RENDERED])
def test_rendered_config_is_its_golden(provisioned, host, path, name):
    text = masked(name, provisioned.read(host, path))
    if WRITE_MISSING and not (GOLDEN / name).exists():
        (GOLDEN / name).write_text(text)
    assert text == golden(name)


# ------------------------------------------------------------------------------------------ the runs

def test_first_run_succeeds_on_every_host(provisioned):
    run = provisioned.runs["first"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    stats = stats_of(provisioned.run_dirs["first"] / "events.jsonl")
    assert sorted(stats["ok"]) == list(provisioned.hosts)
    assert not stats["failures"] and not stats["dark"]
    assert all(stats["changed"][h] > 10 for h in provisioned.hosts)
    assert "rollout complete: 3 hosts" in run.stdout


def test_a_run_without_allow_reboot_leaves_the_daemons_stopped_and_says_which_driver_is_loaded(provisioned):
    """The machines boot with their preinstalled driver (550.90.07), the pin is 550.127.08: the packages are
    installed and the module built, but the old module stays loaded until a reboot, so Fabric Manager and
    persistenced (which refuse another loaded module) are enabled, not started, and the recap says why."""
    pin, old = DRIVER_VERSIONS
    run = provisioned.runs["first"]
    line = next(x for x in run.stdout.splitlines() if x.startswith("reboot pending on 3 hosts"))
    # one reason shared by the hosts: said once, after their names
    assert f"{', '.join(sorted(provisioned.hosts))}: NVIDIA driver: loaded {old}, pinned {pin}" in line, line
    assert provisioned.snapshots["driver-after-first"] == {h: (old, "inactive", "inactive") for h in provisioned.hosts}
    # The IUs wait for the reboot too (enabled, not started): vLLM could not use the GPUs on the old driver.
    assert provisioned.snapshots["ius-after-first"] == {h: "inactive" for h in provisioned.hosts}


def test_allow_reboot_restarts_the_machines_into_the_pinned_driver_and_starts_its_daemons(provisioned):
    pin = DRIVER_VERSIONS[0]
    run = provisioned.runs["reboot"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert provisioned.snapshots["driver-after-reboot"] == {h: (pin, "active", "active") for h in provisioned.hosts}
    events = (provisioned.run_dirs["reboot"] / "events.jsonl").read_text()
    assert "Check that the node booted into the pinned NVIDIA driver" in events
    assert "reboot pending" not in provisioned.runs["second"].stdout


def test_dcgm_comes_from_its_package_and_its_host_engine_runs_on_the_pinned_driver(provisioned):
    """preflight's gate runs `dcgmi diag` against nv-hostengine: the role installs DCGM and runs its unit."""
    for host in provisioned.hosts:
        version = provisioned.on_host(host, "dpkg-query", "-W", "-f=${Version}", "datacenter-gpu-manager")
        assert version.stdout == "1:3.3.9", (host, version.stdout, version.stderr)
        active = provisioned.on_host(host, "systemctl", "is-active", "nvidia-dcgm.service")
        assert active.stdout.strip() == "active", host
        # preflight's `dcgmi` is the package's (the machine has none of its own) and reaches the host engine
        found = provisioned.on_host(host, "sh", "-c", "command -v dcgmi")
        assert found.stdout.strip() == "/usr/bin/dcgmi", (host, found.stdout)
        diag = provisioned.on_host(host, "dcgmi", "diag", "-r", "1", "-j")
        assert diag.returncode == 0 and "DCGM GPU Diagnostic" in diag.stdout, (host, diag.stdout[-500:])


def test_a_driver_bump_previews_in_check_mode_then_reboots_into_the_new_pin(provisioned):
    """Pin A -> pin B on a provisioned host: --check reports the reboot the bump needs and changes nothing (the
    installed packages are still A's); the run with --allow-reboot installs B, builds its module, restarts the
    machine into it and starts Fabric Manager on it. Then back to A the same way."""
    host = OTHER_TOPOLOGY_HOST
    pin, other = DRIVER_VERSIONS
    host_vars = provisioned.inventory / "host_vars" / f"{host}.yml"
    original = host_vars.read_text()
    try:
        host_vars.write_text(original + f"nvidia_stack_driver_version: '{other}'\n")
        check = provisioned.provision("bump-check", "--limit", host, "--tags", "nvidia_stack", "--check")
        assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
        assert f"{host}: NVIDIA driver: loaded {pin}, pinned {other}" in " ".join(check.stdout.split())
        assert provisioned.driver_state()[host] == (pin, "active", "active")
        bump = provisioned.provision("bump", "--limit", host, "--tags", "nvidia_stack", "--allow-reboot")
        assert bump.returncode == 0, bump.stdout[-3000:] + bump.stderr[-2000:]
        assert provisioned.driver_state()[host] == (other, "active", "active")
    finally:
        host_vars.write_text(original)
        back = provisioned.provision("bump-back", "--limit", host, "--tags", "nvidia_stack", "--allow-reboot")
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-2000:]
    assert provisioned.driver_state()[host] == (pin, "active", "active")


def test_second_run_changes_nothing(provisioned):
    run = provisioned.runs["second"]
    assert run.returncode == 0, run.stdout[-3000:]
    stats = stats_of(provisioned.run_dirs["second"] / "events.jsonl")
    assert sorted(stats["ok"]) == list(provisioned.hosts)
    assert stats["changed"] == {}, f"not idempotent: {stats['changed']}"


def test_a_rerun_repairs_drift_that_the_host_state_shortcut_must_not_hide(provisioned):
    """The roles skip writes, users and units that clusterctl.infra.host_state finds in place: each kind of
    drift below (files, modes, owners, users, units, a package downgraded and a repository removed by hand)
    must still be found and repaired by the next run, and the run after that changes nothing."""
    host, sh = ROCE_HOST, lambda script: provisioned.on_host(ROCE_HOST, "sh", "-ec", script)
    drift = sh(
        "echo NCCL_DEBUG=INFO >> /etc/nccl.conf\n"                                   # content
        "chmod 0644 /etc/vllm-iu/0.env\n"                                            # mode
        "chgrp root /etc/consul.d/consul.hcl\n"                                      # group
        "rm /etc/consul.d/vllm-iu-r02n01-iu1.json /usr/local/sbin/roce-dcqcn\n"       # missing files
        "echo {} > /etc/consul.d/vllm-iu-r02n01-iu7.json\n"                          # an IU that no longer exists
        "rm -r /etc/systemd/system/vllm-iu@1.service.d\n"                            # missing directory
        "chmod 0755 /etc/eas-agent\n"                                               # directory mode
        "SYSTEMD_OFFLINE=1 systemctl disable eas-agent.service\n"                    # unit
        "usermod -s /bin/sh eas-agent\n"                                             # user
        "systemctl stop roce-dcqcn.service\n"                                        # a stopped unit
        f"apt-get install -y -qq --allow-downgrades {FM}={OLD_FM} >/dev/null\n"      # a downgraded package
        "rm /etc/apt/sources.list.d/hashicorp.sources\n"                             # a removed repository
        f"rm {CUDA_LIST}\n"                                                          # a package's conffile
    )
    assert drift.returncode == 0, drift.stderr
    repair = provisioned.provision("repair", "--batches", "100%", "--limit", host)
    assert repair.returncode == 0, repair.stdout[-3000:]
    changed = stats_of(provisioned.run_dirs["repair"] / "events.jsonl")["changed"]
    assert changed.get(host, 0) >= 7, changed
    assert provisioned.read(host, "/etc/nccl.conf") == golden("nccl-roce.conf")
    assert provisioned.stat(host, "/etc/vllm-iu/0.env") == "640 root vllm"
    assert provisioned.stat(host, "/etc/consul.d/consul.hcl") == "640 root consul"
    assert provisioned.exists(host, "/etc/consul.d/vllm-iu-r02n01-iu1.json")
    assert not provisioned.exists(host, "/etc/consul.d/vllm-iu-r02n01-iu7.json")
    assert provisioned.read(host, "/usr/local/sbin/roce-dcqcn") == golden("roce-dcqcn.sh")
    assert provisioned.exists(host, "/etc/systemd/system/vllm-iu@1.service.d/10-numa.conf")
    assert provisioned.stat(host, "/etc/eas-agent") == "750 root eas-agent"
    assert provisioned.exists(host, "/etc/systemd/system/multi-user.target.wants/eas-agent.service")
    assert provisioned.on_host(host, "getent", "passwd", "eas-agent").stdout.strip().endswith(":/usr/sbin/nologin")
    # the boot unit's files were in place: only a start task that runs every run brings it back
    assert provisioned.on_host(host, "systemctl", "is-active", "roce-dcqcn.service").stdout.strip() == "active"
    fm_version = provisioned.on_host(host, "dpkg-query", "-W", "-f=${Version}", FM).stdout
    assert fm_version == f"{DRIVER_VERSIONS[0]}-1", fm_version  # back at the pin, not left at the downgrade
    assert "Types: deb" in provisioned.read(host, "/etc/apt/sources.list.d/hashicorp.sources")
    # dpkg leaves a deleted conffile deleted on a plain reinstall: the role must ask for it back
    assert "cuda-archive-keyring.gpg" in provisioned.read(host, CUDA_LIST)
    # dpkg puts NVIDIA's entry back (the stand-in's, like the real one, names NVIDIA's server): the role points
    # it at the inventory's repository again
    assert "developer.download.nvidia.com" not in provisioned.read(host, CUDA_LIST)
    again = provisioned.provision("after-repair", "--batches", "100%", "--limit", host)
    assert again.returncode == 0, again.stdout[-3000:]
    assert stats_of(provisioned.run_dirs["after-repair"] / "events.jsonl")["changed"] == {}


def test_a_failing_roce_boot_unit_fails_the_run_with_the_scripts_reason(provisioned):
    """mlnx-tools gone from an OFED host: the boot unit fails. A rerun whose files did not change starts it
    again and fails naming the script's reason (not: ok, the unit left failed); once the tool is back, the
    next run starts it."""
    host, port = ROCE_HOST, "enp26s0np0"
    broken = provisioned.on_host(host, "sh", "-c", "mv /usr/bin/mlnx_qos /usr/bin/mlnx_qos.away && "
                                 "systemctl restart roce-dcqcn.service; systemctl is-active roce-dcqcn.service")
    assert broken.stdout.strip() == "failed", broken.stdout + broken.stderr
    try:
        run = provisioned.provision("roce-fails", "--limit", host, "--tags", "rdma_network")
    finally:
        provisioned.on_host(host, "mv", "/usr/bin/mlnx_qos.away", "/usr/bin/mlnx_qos")
    assert run.returncode == 1, run.stdout[-3000:]
    out = " ".join(run.stdout.split())
    assert (f"roce-dcqcn.service failed: roce-dcqcn: {port}: MLNX_OFED ecn sysfs present but /usr/bin/mlnx_qos "
            "missing") in out, out[-2000:]
    again = provisioned.provision("roce-repaired", "--limit", host, "--tags", "rdma_network")
    assert again.returncode == 0, again.stdout[-3000:]
    assert provisioned.on_host(host, "systemctl", "is-active", "roce-dcqcn.service").stdout.strip() == "active"


def test_check_diff_reports_changes_but_changes_nothing(provisioned):
    run = provisioned.runs["check"]
    assert run.returncode == 0, run.stdout[-3000:]
    stats = stats_of(provisioned.run_dirs["check"] / "events.jsonl")
    assert all(stats["changed"].get(h, 0) > 10 for h in provisioned.hosts)
    assert provisioned.snapshots["after-check"] == provisioned.snapshots["fresh"]
    events = (provisioned.run_dirs["check"] / "events.jsonl").read_text()
    assert "+NCCL_IB_HCA==mlx5_0:1" in events.replace("\\n", "\n")  # --diff content of /etc/nccl.conf


def test_every_provisioned_machine_carries_the_stamp_virtual_up_reads(provisioned):
    """The fact "provisioned" is on the machines themselves (playbooks/tasks/provisioned.yml), written by the
    real run only, and read from their overlays as `virtual up` reads it."""
    from sim.hosts import lifecycle, run_state

    assert not [path for path in provisioned.snapshots["after-check"] if path.endswith(run_state.PROVISIONED_STAMP)]
    assert sorted(run_state.provisioned(lifecycle.layout(provisioned.inventory))) == sorted(provisioned.hosts)
    assert provisioned.stat(IB_HOST, run_state.PROVISIONED_STAMP) == "644 root root"


def test_events_are_json_lines_with_every_host(provisioned):
    lines = (provisioned.run_dirs["first"] / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    hosts = {e["event_data"].get("host") for e in events if e.get("event") == "runner_on_ok"}
    assert hosts == set(provisioned.hosts)


def test_secrets_never_reach_output_or_events(provisioned):
    for name, run in provisioned.runs.items():
        assert TOKEN not in run.stdout + run.stderr, name
        assert TOKEN not in (provisioned.run_dirs[name] / "events.jsonl").read_text(), name


# ------------------------------------------------------------------------------- rendered results

def test_grub_dropin_and_pm_qos_unit(provisioned):
    for host in provisioned.hosts:
        assert provisioned.read(host, "/etc/default/grub.d/60-clusterctl-cstates.cfg") == golden("grub-cstates-intel.cfg")
        assert provisioned.read(host, "/etc/systemd/system/cpu-dma-latency.service") == golden("cpu-dma-latency.service")
        assert provisioned.exists(host, "/etc/systemd/system/sysinit.target.wants/cpu-dma-latency.service")


def test_the_connecting_user_reads_the_kernel_log(provisioned):
    """preflight reads journalctl -k as the inventory's user, without sudo: it must be in systemd-journal."""
    for host in provisioned.hosts:
        groups = {line.split(":")[0]: line.rstrip("\n").split(":")[3].split(",")
                  for line in provisioned.read(host, "/etc/group").splitlines() if line.count(":") == 3}
        assert "deploy" in groups["systemd-journal"], (host, groups["systemd-journal"])


def test_sysctl_dropin(provisioned):
    text = provisioned.read(IB_HOST, "/etc/sysctl.d/60-clusterctl-numa.conf")
    assert "kernel.numa_balancing = 0\n" in text and "vm.swappiness = 1\n" in text


@pytest.mark.parametrize(("host", "name"), [(IB_HOST, "nccl-ib.conf"), (ROCE_HOST, "nccl-roce.conf")])
def test_nccl_conf(provisioned, host, name):
    text = provisioned.read(host, "/etc/nccl.conf")
    assert text == golden(name)
    settings = [line for line in text.splitlines() if line and not line.startswith("#")]
    for line in settings:
        assert re.fullmatch(r"NCCL_[A-Z0-9_]+=\S+", line), f"not KEY=VALUE without spaces: {line!r}"
    roce_only = {"NCCL_IB_TC=106"}
    assert roce_only <= set(settings) if host == ROCE_HOST else not roce_only & set(settings)
    # NCCL >= 2.21 picks the RoCEv2 GID itself; a fixed index breaks when IPv6 addresses shift the table.
    assert not any(line.startswith("NCCL_IB_GID_INDEX=") for line in settings)


def test_nccl_tests_are_built_from_the_pinned_tarball_on_the_one_host_that_names_one(provisioned):
    """r02n01's host_vars name a stand-in nccl-tests tarball and its sha256 (helpers.write_inventory): site.yml
    copied it over SSH, built it with the make it installed, and linked the binaries into the host's bin dir;
    the check-mode run before and the second run after changed nothing (the tests above)."""
    done = provisioned.on_host("r02n01", f"{NCCL_TESTS_BIN}/all_reduce_perf")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "all_reduce_perf from 2.13.11 built with CUDA_HOME=/usr/local/cuda-12.4 MPI=0"
    assert provisioned.on_host("r02n01", "readlink", "/opt/nccl-tests/build").stdout.strip().startswith("build-")
    assert provisioned.on_host("r01n01", "test", "-e", "/opt/nccl-tests").returncode != 0


def test_dcqcn_unit_only_on_roce_hosts(provisioned):
    assert provisioned.read(ROCE_HOST, "/etc/systemd/system/roce-dcqcn.service") == golden("roce-dcqcn.service")
    assert provisioned.read(ROCE_HOST, "/usr/local/sbin/roce-dcqcn") == golden("roce-dcqcn.sh")
    assert provisioned.stat(ROCE_HOST, "/usr/local/sbin/roce-dcqcn").startswith("755 ")
    assert provisioned.exists(ROCE_HOST, "/etc/systemd/system/multi-user.target.wants/roce-dcqcn.service")
    for host in (IB_HOST, OTHER_TOPOLOGY_HOST):
        assert not provisioned.exists(host, "/etc/systemd/system/roce-dcqcn.service")
        assert not provisioned.exists(host, "/usr/local/sbin/roce-dcqcn")


def test_dcqcn_script_names_the_roce_ports_that_exist_on_the_host(provisioned):
    script = provisioned.read(ROCE_HOST, "/usr/local/sbin/roce-dcqcn")
    netdevs = re.search(r"^for IF in (.*); do$", script, re.M).group(1).split()
    assert netdevs == ["enp26s0np0", "enp60s0np0", "enp156s0np0", "enp188s0np0"]
    for netdev in netdevs:
        assert provisioned.exists(ROCE_HOST, f"/sys/class/net/{netdev}/ecn/roce_np/enable/3")


def test_each_iu_unit_env_and_numa_binding_from_the_host_topology(provisioned):
    cluster = load_cluster(provisioned.inventory)
    cpulists = {}
    assert provisioned.read(IB_HOST, "/etc/systemd/system/vllm-iu@.service") == golden("vllm-iu@.service")
    for host in provisioned.hosts:
        node = cluster.node(host)
        for iu in node.ius:
            cpus = provisioned.read(host, f"/sys/devices/system/node/node{iu.numa_node}/cpulist").strip()
            cpulists[(host, iu.numa_node)] = cpus
            dropin = provisioned.read(host, f"/etc/systemd/system/vllm-iu@{iu.index}.service.d/10-numa.conf")
            assert "\nNUMAPolicy=bind\n" in dropin
            assert f"\nNUMAMask={iu.numa_node}\n" in dropin
            assert f"\nCPUAffinity={cpus}\n" in dropin
            env = dict(
                line.split("=", 1) for line in provisioned.read(host, f"/etc/vllm-iu/{iu.index}.env").splitlines()
                if line and not line.startswith("#")
            )
            assert env["CUDA_VISIBLE_DEVICES"] == iu.cuda_visible_devices
            # VLLM_PORT is vLLM's first internal port, not the API port: set to it, IU0's internal ports
            # land on IU1's API port. The API port is --port only.
            assert "VLLM_PORT" not in env
            assert f"--tensor-parallel-size {node.iu_size} " in env["VLLM_ARGS"]
            assert f"--host {node.address} " in env["VLLM_ARGS"] and env["VLLM_ARGS"].endswith(f"--port {iu.port}")
            assert env["NCCL_IB_HCA"] == "=" + ",".join(f"{d}:1" for d in iu.nics)
            assert provisioned.stat(host, f"/etc/vllm-iu/{iu.index}.env") == "640 root vllm"
            assert provisioned.exists(host, f"/etc/systemd/system/multi-user.target.wants/vllm-iu@{iu.index}.service")
    assert provisioned.read(IB_HOST, "/etc/vllm-iu/0.env") == golden("vllm-iu-r01n01-0.env")
    # the 56-core host's CPUs differ from the 48-core hosts': the lists were read, not typed
    assert cpulists[(IB_HOST, 1)] == "48-95,144-191"
    assert cpulists[(OTHER_TOPOLOGY_HOST, 1)] == "56-111,168-223"
    # vLLM's key: the inventory's, as VLLM_API_KEY in a 0600 file of root's, never in the arguments
    api_key = yaml.safe_load((Path(provisioned.inventory) / "group_vars" / "all.yml").read_text())["inference_unit_api_key"]
    for host in provisioned.hosts:
        assert provisioned.stat(host, "/etc/vllm-iu/api-key.env") == "600 root root"
        assert provisioned.read(host, "/etc/vllm-iu/api-key.env") == f"VLLM_API_KEY={api_key}\n"
        assert api_key not in provisioned.read(host, "/etc/vllm-iu/0.env")


def test_the_ius_refuse_requests_without_their_key(provisioned):
    node = load_cluster(provisioned.inventory).node(IB_HOST)
    url = f"http://{node.address}:{node.ius[0].port}/v1/models"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10)
    assert refused.value.code == 401
    api_key = yaml.safe_load((Path(provisioned.inventory) / "group_vars" / "all.yml").read_text())["inference_unit_api_key"]
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def test_the_firewall_rules_are_checked_and_never_loaded_on_machines_that_share_a_namespace(provisioned):
    for host in provisioned.hosts:
        assert provisioned.stat(host, "/etc/clusterctl/firewall.nft") == "644 root root"
        assert not provisioned.exists(host, "/etc/systemd/system/sysinit.target.wants/clusterctl-firewall.service")


def test_consul_service_definitions(provisioned):
    cluster = load_cluster(provisioned.inventory)
    assert provisioned.read(IB_HOST, "/etc/consul.d/vllm-iu-r01n01-iu0.json") == golden("consul-vllm-iu-r01n01-iu0.json")
    for host in provisioned.hosts:
        node = cluster.node(host)
        for iu in node.ius:
            service = json.loads(provisioned.read(host, f"/etc/consul.d/vllm-iu-{iu.id}.json"))["service"]
            assert (service["name"], service["id"], service["port"]) == (f"vllm-iu-{host}", iu.id, iu.port)
            assert service["tags"] == [f"rack:{node.rack}", f"node:{host}"]
            # the revision from the inventory's pins (vLLM, model, driver), none of which this inventory sets
            assert service["meta"] == {"gpus": iu.cuda_visible_devices, "numa_node": str(iu.numa_node),
                                       "node": host, "rack": node.rack,
                                       "revision": "vllm-unknown+any+driver-unknown"}
            (check,) = service["checks"]
            assert check["http"] == f"http://{node.address}:{iu.port}/health"
            assert int(check["interval"].rstrip("s")) <= 15
        hcl = provisioned.read(host, "/etc/consul.d/consul.hcl")
        assert 'datacenter = "dc1"' in hcl and 'retry_join = ["127.0.1.11"]' in hcl
        assert ("server     = true" in hcl) == (host == "r01n01")
        assert provisioned.stat(host, "/etc/consul.d/consul.hcl") == "640 root consul"


def test_eas_agent_config_and_token(provisioned):
    cluster = load_cluster(provisioned.inventory)
    text = provisioned.read(IB_HOST, "/etc/eas-agent/config.yml")
    assert text == golden("eas-agent-config-r01n01.yml")
    edge_keys = yaml.safe_load((Path(provisioned.inventory) / "group_vars" / "all.yml").read_text())[
        "eas_edge_public_keys"]
    tokens = {}
    for host in provisioned.hosts:
        node = cluster.node(host)
        config = parse_config(yaml.safe_load(provisioned.read(host, "/etc/eas-agent/config.yml")), host)
        assert (config.node, config.rack) == (host, node.rack)
        assert [(iu.id, iu.gpus, iu.numa_node, iu.rdma_devices) for iu in config.ius] == [
            (iu.id, iu.gpus, iu.numa_node, iu.nics) for iu in node.ius
        ]
        assert config.consul.token_file == "/etc/eas-agent/consul.token"
        assert provisioned.stat(host, "/etc/eas-agent/consul.token") == "600 eas-agent eas-agent"
        tokens[host] = provisioned.read(host, "/etc/eas-agent/consul.token")
        # the announce channel: the edges' public keys (no secret), the inventory's, in the file the config names
        assert config.announce_keys_file == "/etc/eas-agent/edge-keys.pub"
        assert provisioned.stat(host, "/etc/eas-agent/edge-keys.pub") == "640 root eas-agent"
        keys = provisioned.read(host, "/etc/eas-agent/edge-keys.pub")
        assert all(f"{edge['key']} {edge['name']}" in keys for edge in edge_keys)
        assert len(parse_public_keys(keys)) == len(edge_keys)
        assert not provisioned.exists(host, "/etc/eas-agent/announce.token")
    assert tokens[IB_HOST] == TOKEN + "\n"  # the vault value (the others' come from the inventory)
    assert len(set(tokens.values())) == len(tokens) and all(t.strip() for t in tokens.values())
    unit = provisioned.read(IB_HOST, "/etc/systemd/system/eas-agent.service")
    assert unit == golden("eas-agent.service")


# ---------------------------------------------------------------------------- systemd-analyze verify

UNITS = ("cpu-dma-latency.service", "vllm-iu@0.service", "vllm-iu@1.service", "eas-agent.service", "eas-edge.service")


def test_units_pass_systemd_analyze_verify(provisioned):
    """verify exits 0 on parse errors (it only warns): any stderr is a failure. It also needs the
    ExecStart binaries: the first run installed them (vLLM's and the agent's venvs)."""
    host = IB_HOST
    try:
        for unit in UNITS:
            result = provisioned.on_host(host, "systemd-analyze", "verify", f"/etc/systemd/system/{unit}")
            assert (result.returncode, result.stderr) == (0, ""), f"{unit}: {result.stderr}"
        # the same check catches a broken drop-in (negative control)
        broken = provisioned.on_host(host, "sh", "-c", "mkdir -p /etc/systemd/system/vllm-iu@9.service.d && "
                                     "printf '[Service]\\nNUMAMask=zz\\n' > /etc/systemd/system/vllm-iu@9.service.d/x.conf && "
                                     "systemd-analyze verify /etc/systemd/system/vllm-iu@9.service")
        assert broken.returncode == 0 and "NUMA" in broken.stderr
    finally:
        provisioned.on_host(host, "rm", "-rf", "/etc/systemd/system/vllm-iu@9.service.d")


# ------------------------------------------------------------------- a changed template restarts

SERVICES = ("chrony.service", "vllm-iu@0.service", "vllm-iu@1.service", "eas-agent.service", "consul.service",
            "nvidia-fabricmanager.service", "nvidia-persistenced.service", "eas-edge.service", "haproxy.service")


def main_pids(provisioned, host: str) -> dict[str, int]:
    result = provisioned.on_host(host, "systemctl", "show", "--property", "MainPID", "--value", *SERVICES)
    assert result.returncode == 0, result.stderr
    pids = dict(zip(SERVICES, map(int, result.stdout.split()), strict=True))
    assert all(pids.values()), f"{host}: a unit is not running: {pids}"
    return pids


def test_a_changed_template_restarts_exactly_the_units_it_feeds(provisioned):
    """chrony.conf and the IUs' env files change (two inventory values): chrony gets a new MainPID, the
    serving IUs keep theirs (they restart through rolling-restart.yml, which drains them first), every other
    service keeps its process. Changed back with inference_unit_restart_on_change: now chrony and both
    vllm-iu units restart, and nothing else."""
    host = IB_HOST
    host_vars = provisioned.inventory / "host_vars" / f"{host}.yml"
    original = host_vars.read_text()

    outputs: dict[str, str] = {}

    def restarted_by(name: str, extra: str) -> set[str]:
        before = main_pids(provisioned, host)
        host_vars.write_text(original + extra)
        try:
            run = provisioned.provision(name, "--batches", "100%", "--limit", host)
        finally:
            host_vars.write_text(original)
        assert run.returncode == 0, run.stdout[-3000:]
        outputs[name] = " ".join(run.stdout.split())
        after = main_pids(provisioned, host)
        return {unit for unit in SERVICES if after[unit] != before[unit]}

    assert restarted_by("changed-template", "chrony_makestep_limit: 4\ninference_unit_max_num_seqs: 64\n") == {
        "chrony.service"}
    # ... and the recap says which IUs still run the old configuration
    assert (f"IU restart pending on 1 host: {host}: {host}-iu0, {host}-iu1 (configuration changed; run "
            "playbooks/rolling-restart.yml)") in outputs["changed-template"], outputs["changed-template"][-2000:]
    assert restarted_by("template-restored", "inference_unit_restart_on_change: true\n") == {
        "chrony.service", "vllm-iu@0.service", "vllm-iu@1.service"}
    assert "restart pending" not in outputs["template-restored"]
    assert provisioned.read(host, "/etc/chrony/chrony.conf") == golden("chrony.conf")


# ----------------------------------------------------------------------------- plan, bad inputs

def test_plan_touches_nothing(provisioned):
    before = provisioned.upper_snapshot()
    run_dir = provisioned.inventory.parent / "run-plan"
    result = clusterctl("provision", "-i", str(provisioned.inventory), "--plan", "--run-dir", str(run_dir),
                        "--batches", "1,50%", env=provisioned.env)
    assert result.returncode == 0, result.stderr
    assert "batches 1,50%" in result.stdout and "cpu_cstates -> numa_tuning" in result.stdout
    # batch, play, hosts, members: the Consul server's own play first, then (play 2, the dedicated Consul
    # servers', has no host here and no batch) the batched play
    assert re.search(r"1\s+1\s+1\s+r01n01", result.stdout) and re.search(r"2\s+3\s+1\s+r01n01", result.stdout)
    assert re.search(r"3\s+3\s+1\s+r01n02", result.stdout)
    assert "play 2: Time sync and the host firewall on the dedicated Consul servers" in result.stdout
    assert "(no host of this run)" in result.stdout
    assert not run_dir.exists()
    after = provisioned.upper_snapshot()
    assert after == before, sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))[:20]


@pytest.mark.parametrize(
    ("tag", "extra_vars", "named"),
    [
        ("inference_unit", {"inference_unit_max_num_seqs": 512}, "inference_unit_max_num_seqs"),
        ("consul_agent", {"consul_agent_health_interval": "30s"}, "consul_agent_health_interval"),
        ("cpu_cstates", {"cpu_cstates_redfish": True, "bmc_address": "127.0.9.11", "bmc_username": "root"},
         "password"),
    ],
)
def test_bad_inputs_fail_in_argument_validation(provisioned, tag, extra_vars, named):
    result = ansible_playbook(provisioned.inventory, str(Path("playbooks/site.yml")), "--limit", IB_HOST,
                              "--tags", tag, "-e", json.dumps(extra_vars), env=provisioned.env)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Validation of arguments failed" in out and named in out, out[-2000:]
    role_tasks = re.findall(rf"TASK \[{tag} : ([^\]]+)\]", out)
    assert role_tasks and all(t.startswith("Validating arguments") for t in role_tasks), role_tasks


def test_a_repository_key_that_is_not_pinned_is_never_trusted(provisioned):
    """HashiCorp's signing key came from the repository's own host and nothing checked it.
    Pinned to another fingerprint, the key the stand-in repository serves is refused, naming both, and the
    host's repository entry keeps the key the last good run wrote."""
    from sim.hosts import repos

    served = json.loads((repos.cache_root() / "served" / "apt" / ".recipe").read_text())["fingerprint"]
    entry = "/etc/apt/sources.list.d/hashicorp.sources"
    before = provisioned.read(IB_HOST, entry)
    assert "-----BEGIN PGP PUBLIC KEY BLOCK-----" in before  # the checked key itself, not a URL
    wrong = "0000 1111 2222 3333 4444  5555 6666 7777 8888 9999"
    result = ansible_playbook(provisioned.inventory, str(Path("playbooks/site.yml")), "--limit", IB_HOST,
                              "--tags", "consul_agent", "-e", json.dumps({"consul_agent_repo_key_fingerprints": [wrong]}),
                              env=provisioned.env)
    out = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0
    assert (f"http://127.0.255.1:8080/apt/hashicorp/gpg is the key {served}, which consul_agent_repo_key_fingerprints "
            "does not pin (0000111122223333444455556666777788889999): not trusted") in out, out[-2000:]
    assert provisioned.read(IB_HOST, entry) == before


def test_a_direct_playbook_run_stops_on_a_bad_inventory(provisioned):
    """No clusterctl in front: the cluster_node filter validates, and the role's first task fails naming
    host, variable and value (iu_size has no role variable: vLLM's tensor parallel size is the IU's size)."""
    result = ansible_playbook(provisioned.inventory, str(Path("playbooks/site.yml")), "--limit", IB_HOST,
                              "--tags", "inference_unit", "-e", json.dumps({"iu_size": 3}), env=provisioned.env)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"{IB_HOST}: iu_size=3: must be one of 1/2/4/8" in out, out[-2000:]
    assert "Validation of arguments failed" not in out


def test_inventory_errors_stop_before_any_host(provisioned, tmp_path):
    bad = tmp_path / "bad-inventory"
    bad.mkdir()
    (bad / "hosts.yml").write_text((provisioned.inventory / "hosts.yml").read_text())
    (bad / "group_vars").mkdir()
    (bad / "group_vars" / "all.yml").write_text("gpu_model: h100-sxm\ngpu_count: 8\niu_size: 3\n")
    result = clusterctl("provision", "-i", str(bad), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "iu_size" in result.stderr
    assert not (tmp_path / "run").exists()


# -------------------------------------------------------------------------- stop-on-failure batches

def test_a_failing_batch_stops_the_rollout(provisioned):
    """r01n02 is put on hold (injected failure): batches 1-2 (r01n01: the Consul servers' play, then its batch
    of the main play) are done, batch 3 fails, batch 4 (and the edges' 5-6, the balancer's 7 and the servers'
    reboot play, 8) never runs."""
    host_vars = provisioned.inventory / "host_vars" / "r01n02.yml"
    original = host_vars.read_text()
    host_vars.write_text(original + 'clusterctl_hold: "injected failure for the batch test"\n')
    try:
        result = provisioned.provision("held", "--tags", "chrony")
    finally:
        host_vars.write_text(original)
    assert result.returncode == 1
    out = " ".join(result.stdout.split())
    assert "rollout stopped in batch 3/8" in out
    assert "failed/unreachable: r01n02" in out and "done: r01n01" in out and "not started: r02n01" in out
    assert "injected failure for the batch test" in out
    stats = stats_of(provisioned.run_dirs["held"] / "events.jsonl")
    assert ROCE_HOST not in stats["ok"] and stats["failures"] == {"r01n02": 1}


# ------------------------------------------------------------------------ SSH failures stop the batch

@pytest.mark.parametrize("failure", ["host key changed", "key rejected"])
def test_a_host_unreachable_over_ssh_stops_the_rollout_with_the_reason(provisioned, tmp_path, failure):
    """r01n02's host key in known_hosts replaced, or its SSH key not the authorized one: that host is
    UNREACHABLE with ssh's reason, its batch (3: after the Consul servers' play and r01n01's) stops, batch 4
    never starts (ansible-runner's default of
    ANSIBLE_HOST_KEY_CHECKING=False would have let the changed key through)."""
    import subprocess

    from sim.hosts import lifecycle as simulate

    other_key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    layout = simulate.layout(provisioned.inventory)
    host_vars = provisioned.inventory / "host_vars" / "r01n02.yml"
    originals = {layout.known_hosts: layout.known_hosts.read_text(), host_vars: host_vars.read_text()}
    if failure == "host key changed":
        fake = " ".join(other_key.with_suffix(".pub").read_text().split()[:2])
        layout.known_hosts.write_text(re.sub(r"^127\.0\.1\.12 .*$", f"127.0.1.12 {fake}",
                                             originals[layout.known_hosts], flags=re.M))
        reason = "Host key verification failed"
    else:
        host_vars.write_text(originals[host_vars] + f"ansible_ssh_private_key_file: {other_key}\n")
        reason = "Permission denied (publickey"
    # The earlier runs' ControlPersist master to r01n02 would carry this run without a new handshake
    # (what ssh does for up to ControlPersist=60s); end it, so the run connects and checks afresh.
    subprocess.run(["ssh", "-o", "ControlPath=/tmp/.clusterctl-cp/%C", "-O", "exit", "deploy@127.0.1.12"],
                   capture_output=True)
    try:
        result = provisioned.provision(f"ssh-{failure.replace(' ', '-')}", "--tags", "chrony")
    finally:
        for path, text in originals.items():
            path.write_text(text)
    assert result.returncode == 1
    out = " ".join(result.stdout.split())
    assert "rollout stopped in batch 3/8" in out and "not started: r02n01" in out
    assert "r01n02: unreachable:" in out and reason in out, out[-2000:]


# ------------------------------------------------- the machines' own Consul: agents, ACLs, rolling restart, release
# Last in the module: it changes the token rule (consul_token_file), restarts agents and stops two of them. On the
# cluster the module already provisioned (site.yml runs consul_agent, eas_agent and inference_unit): its own
# bring-up and provisioning cost ~5 minutes of CI for machines identical to these.

SERVER = "127.0.1.11:8500"  # r01n01 runs the server (the virtual inventory's consul_agent_server_hosts)
DRAIN_S = 10  # the stand-in vLLM's own arrivals (1 req/s) never drain: bound each IU's wait, as an inventory can


def _get(address: str, path: str, token: str):
    request = urllib.request.Request(f"http://{address}{path}", headers={"X-Consul-Token": token})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def _status(address: str, path: str, token: str, method: str = "PUT") -> int:
    request = urllib.request.Request(f"http://{address}{path}", method=method, headers={"X-Consul-Token": token})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _iu_listing(token: str, index: int = 0, wait_s: float = 0.0) -> tuple[int, list[dict]]:
    """(index, every IU instance of every node's vllm-iu-<node>) from the server, as the edge reads it."""
    from consul_io.client import ConsulIO

    return ConsulIO(SERVER, token=token, timeout_s=10).health_service(index=index or None, wait_s=wait_s or None)


def _maintenance_notes(token: str, index: int = 0, wait_s: float = 0.0) -> tuple[int, dict[str, str]]:
    """(index, IU -> its maintenance reason, "" when not in maintenance) from the server's health."""
    got, entries = _iu_listing(token, index, wait_s)
    return got, {e["Service"]["ID"]: next((c["Notes"] for c in e["Checks"]
                                           if c["CheckID"].startswith("_service_maintenance:")), "")
                 for e in entries}


def _release(node) -> list[str]:
    """preflight's release (preflight/release.py) of a node, as after a passed run."""
    from preflight.release import release_passed
    from preflight.result import CheckResult, Verdict
    from preflight.runner import RunOutcome

    passed = CheckResult(node.rack, node.name, None, "consul", Verdict.PASS, "stand-in for a passed run", {})
    return sorted(release_passed([node], RunOutcome([passed], 0.0, 0.0, None, ["consul"]))[node.name])


@pytest.fixture
def group_vars_kept(provisioned):
    """The inventory's group_vars as they were before the test, whatever it wrote (test_site_virtual_edges runs
    on the same cluster next)."""
    path = provisioned.inventory / "group_vars" / "all.yml"
    original = path.read_text()
    yield path
    path.write_text(original)


def test_agents_hold_every_iu_and_the_rolling_restart_and_release_go_through_them(provisioned, tmp_path,
                                                                                   group_vars_kept):
    """The consul_agent, eas_agent and inference_unit roles ran for real over SSH (consul from the stand-in
    HashiCorp repository, the venvs from the local package index, their units started), consul.service joined to
    the server with ACLs on (default deny), gossip key and TLS as rendered. In order: every IU in the catalog and in
    maintenance after every run of this module (no run released one); ACL denials; an agent restart and a reload
    keep maintenance; rolling-restart.yml (one node per batch) takes every released IU out of rotation and back
    while an operator's quarantine and another node's preflight hold stay untouched; preflight's release makes a
    node's IUs routable in the edge's reader (ConsulWatcher + PoolView, the read-only edge token); stopping the IUs'
    vLLM units makes their checks critical within the check interval and the reader drops them; stopping a node's
    consul.service makes the server fail the node (serfHealth) and its IUs leave the pool."""
    inventory = provisioned.inventory
    group_vars = group_vars_kept
    secrets = yaml.safe_load(group_vars.read_text())
    management, operator = secrets["consul_agent_acl_management_token"], secrets["consul_token"]
    # The token rule's file half (a 0600 file on the controller), read by rolling-restart.yml and preflight's release
    token_file = tmp_path / "consul.token"
    token_file.write_text(operator + "\n")
    token_file.chmod(0o600)
    group_vars.write_text(group_vars.read_text().replace(f"consul_token: {operator}\n", "")
                          + f"\nconsul_token_file: {token_file}\nrolling_restart_drain_timeout_s: {DRAIN_S}\n")
    cluster = load_cluster(inventory)

    def in_maintenance() -> dict[str, bool]:
        entries = _iu_listing(management)[1]
        return {e["Service"]["ID"]: any(c["CheckID"].startswith("_service_maintenance:") for c in e["Checks"])
                for e in entries}

    wanted = {iu.id for node in cluster.nodes() for iu in node.ius}
    assert wait_until(lambda: set(in_maintenance()) == wanted and all(in_maintenance().values()), 40), \
        in_maintenance()
    assert {n["Node"] for n in _get(SERVER, "/v1/catalog/nodes", management)} == set(provisioned.hosts)
    # ACL denial: the node's agent token may not set maintenance; anonymous reads see nothing
    agent_token = provisioned.on_host("r01n02", "sh", "-c", "grep -o 'agent = \"[^\"]*' /etc/consul.d/consul.hcl")
    token = agent_token.stdout.strip().rsplit('"', 1)[-1]
    assert token and _status("127.0.1.12:8500", "/v1/agent/service/maintenance/r01n02-iu0?enable=false", token) == 403
    assert _get(SERVER, "/v1/catalog/services", "") == {}
    # a token nobody created is refused outright, on the node's agent as on the server
    assert _status("127.0.1.12:8500", "/v1/agent/services", "00000000-dead-4bad-8bad-000000000000", "GET") == 403
    # restart and reload of an agent keep its IUs in maintenance (no reaping, maintenance persisted)
    for action in ("restart", "reload"):
        assert provisioned.on_host("r01n02", "systemctl", action, "consul.service").returncode == 0
        time.sleep(2)
        assert wait_until(lambda: set(in_maintenance()) == wanted, 30), in_maintenance()
        assert all(in_maintenance().values()), (action, in_maintenance())
    _rolling_restart_keeps_an_operator_quarantine(provisioned, cluster, operator, management)
    _released_iu_routes_then_dies(provisioned, cluster.node("r01n02"), secrets["consul_edge_token"], in_maintenance)
    # stop a node's agent: leave_on_terminate is false, so the server fails it (serfHealth critical)
    assert provisioned.on_host("r02n01", "systemctl", "stop", "consul.service").returncode == 0
    started = time.monotonic()

    def serf_of(node: str) -> str:
        for check in _get(SERVER, f"/v1/health/node/{node}", management):
            if check["CheckID"] == "serfHealth":
                return check["Status"]
        return "missing"

    assert wait_until(lambda: serf_of("r02n01") == "critical", 15), serf_of("r02n01")
    assert time.monotonic() - started < 15
    assert serf_of("r01n01") == "passing"


def _rolling_restart_keeps_an_operator_quarantine(provisioned, cluster, operator: str, management: str) -> None:
    """rolling-restart.yml over the three nodes with their agents live:
    r01n01 and r02n01 released by preflight, then one of r01n01's IUs quarantined by an operator (maintenance with
    the operator's reason, through the node's agent); r01n02 still held for preflight. The run takes every other
    released IU out of rotation and puts it back, node by node (serial: 1), and leaves the quarantine and r01n02's
    preflight hold exactly as they were. Every maintenance state the server saw during the run is recorded in
    order (blocking queries), so "put into maintenance and released, one node after the other" is observed, not
    inferred from the end state; the playbook restarts the IUs' vllm-iu units and waits for their /health."""
    import threading

    first, other = cluster.node("r01n01"), cluster.node("r02n01")
    free, quarantined = (iu.id for iu in first.ius)
    assert _release(first) == [free, quarantined]
    assert _release(other) == sorted(iu.id for iu in other.ius)
    held = {iu.id for iu in cluster.node("r01n02").ius}
    taken = {free} | {iu.id for iu in other.ius}
    reason = "operator quarantine: flaky HCA"
    path = f"/v1/agent/service/maintenance/{quarantined}?enable=true&reason=operator%20quarantine%3A%20flaky%20HCA"
    assert _status(f"{first.address}:8500", path, operator) == 200
    assert wait_until(lambda: [_maintenance_notes(management)[1].get(i) for i in sorted(taken) + [quarantined]]
                      == [""] * len(taken) + [reason], 10), _maintenance_notes(management)
    index, before = _maintenance_notes(management)
    assert all(before[i] for i in held), before
    seen: list[tuple[str, str]] = []  # (IU, reason) in the order the server's states came
    stop = threading.Event()

    def watch() -> None:
        at = index
        while not stop.is_set():
            at, notes = _maintenance_notes(management, at, 2.0)
            seen.extend(sorted(notes.items()))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = provisioned.provision("rolling", "--playbook", "rolling-restart.yml")
        time.sleep(1)  # the last release's sync reaches the server and the watch
    finally:
        stop.set()
        watcher.join(5)
    assert result.returncode == 0, result.stdout[-4000:]
    assert operator not in result.stdout and management not in result.stdout
    events = [json.loads(line) for line in (provisioned.run_dirs["rolling"] / "events.jsonl").read_text().splitlines()]
    assert len([e for e in events if e["event"] == "playbook_on_play_start"]) == 3  # serial: 1
    drains = [e["event_data"]["res"].get("attempts", 1) for e in events if e["event"] == "runner_item_on_ok"
              and e["event_data"].get("task") == "Wait for in-flight requests to drain"]
    assert drains and max(drains) <= DRAIN_S // 5 + 1, drains  # the inventory's limit, at 5 s polls
    rolling = [i for i, n in seen if n == "clusterctl rolling restart"]
    assert set(rolling) == taken, sorted(set(seen))
    # node by node: r01n01's IU is back before r02n01's are taken
    assert max(k for k, iu in enumerate(rolling) if iu == free) < min(k for k, iu in enumerate(rolling) if iu != free)
    after = _maintenance_notes(management)[1]
    assert [after[i] for i in sorted(taken)] == [""] * len(taken) and after[quarantined] == reason, after
    assert {i: after[i] for i in held} == {i: before[i] for i in held}, "the preflight hold stays"
    assert {n for i, n in seen if i == quarantined} == {reason}, "the quarantine never touched"
    assert {n for i, n in seen if i in held} == {before[i] for i in held}, "r01n02 never taken by the run"


def _released_iu_routes_then_dies(provisioned, node, edge_token: str, in_maintenance) -> None:
    from consul_io.client import ConsulIO
    from edge.pool import ConsulWatcher, PoolView

    ius = sorted(iu.id for iu in node.ius)
    units = [f"vllm-iu@{iu.index}.service" for iu in node.ius]  # started by provisioning, as eas-agent.service
    view = PoolView()
    watcher = ConsulWatcher(view, ConsulIO(SERVER, token=edge_token), wait_s=1.0).start()
    try:
        assert _release(node) == ius
        assert wait_until(lambda: not any(v for k, v in in_maintenance().items() if k in ius), 10), in_maintenance()

        def healthy() -> list[str]:  # this node's routable IUs (the other nodes' released IUs are routable too)
            return sorted(e.iu_id for e in view.snapshot().healthy if e.iu_id in ius)

        assert wait_until(lambda: healthy() == ius, 40), (healthy(), view.health)
        assert provisioned.on_host(node.name, "systemctl", "stop", *units).returncode == 0  # the IUs' vLLM stops
        died = time.monotonic()
        assert wait_until(lambda: healthy() == [], 20), healthy()
        # the check interval is 10 s, its timeout 2 s; the server sees the change at once (anti-entropy
        # pushes every change) and the watch returns on it
        assert time.monotonic() - died < 14, time.monotonic() - died
        assert {view.health[(node.name, i)][0] for i in ius} == {"critical"}, view.health
        assert provisioned.on_host(node.name, "systemctl", "start", *units).returncode == 0
        assert wait_until(lambda: healthy() == ius, 40), healthy()
        # the node's agent stops: leave_on_terminate is false, the server fails the node (serfHealth
        # critical, Consul's failure detection) and every IU of it leaves the pool with it
        assert provisioned.on_host(node.name, "systemctl", "stop", "consul.service").returncode == 0
        stopped = time.monotonic()
        assert wait_until(lambda: healthy() == [], 20), healthy()
        assert time.monotonic() - stopped < 20
    finally:
        watcher.stop()
