"""Write a virtual inventory: ``clusterctl virtual create -i DIR --nodes N --racks R``.

Hosts are named ``r<RR>n<NN>`` and spread over the racks in order (rack_rRR groups); addresses are
loopback (127.0.R.10+N) so simulated services never leave the machine; ``net`` moves a whole inventory to
127.<net>.R.10+N, so two virtual clusters can be up at once (``clusterctl demo`` uses its own, beside any
inventory on the default addresses). ``group_vars/all.yml`` holds the
board (GPU model, NICs) and the simulated-host switches; ``host_vars/<host>.yml`` the per-host faults
and, on RoCE racks, the Ethernet NICs. The ``edges`` and ``balancers`` groups place two edges and their
HAProxy on node machines (:func:`edge_placement` says where and why). ``inventory/virtual`` itself is this module's output for
``--nodes 4 --racks 2 --fabric mixed`` (a test keeps them identical).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from cluster.model import GPU_MODELS
from common.text import plural
from sim import consul_security

FABRICS = ("ib", "roce", "mixed")
BALANCER_PORT = 8080  # HAProxy's client port on the balancer's own address (edge_placement)

# NIC n sits under the PCIe switch of GPU 2n (PIX), two buses after it; netdev names are the predictable
# names udev gives ConnectX-7 ports at those addresses (ibp<bus>s0 for IB, enp<bus>s0np0 for Ethernet).
NIC_BUSES = {"h100-sxm": (0x1A, 0x3C, 0x9C, 0xBC), "h200-sxm": (0x1A, 0x3C, 0x9C, 0xBC),
             "a100-sxm": (0x09, 0x49, 0x89, 0xB9)}
NIC_RATE = {"h100-sxm": 400, "h200-sxm": 400, "a100-sxm": 200}

# Fault scenarios of --faults default, each a host's sim_faults: hardware faults that preflight must
# catch and provisioning does not care about. RoCE hosts of the third scenario also get DCQCN off.
FAULT_SCENARIOS: tuple[tuple[str, list[dict]], ...] = (
    ("NVLink pair 2-3 down; row remap pending on GPU 6",
     [{"kind": "nvlink_down", "gpus": [2, 3]}, {"kind": "row_remap_pending", "gpu": 6}]),
    ("mlx5_2 trained at 200 Gb/s; high latency on mlx5_1",
     [{"kind": "ib_port_rate", "device": "mlx5_2", "rate_gbps": 200},
      {"kind": "ib_high_latency", "device": "mlx5_1", "latency_us": 25.0}]),
    ("deep C-states enabled; clock 2.5 ms off; GPU 5 in HW thermal slowdown",
     [{"kind": "cstates_enabled"}, {"kind": "clock_offset", "offset_us": 2500.0},
      {"kind": "gpu_throttle", "gpu": 5}]),
    ("GPU 1 on the wrong NUMA node; uncorrectable ECC error on GPU 4",
     [{"kind": "gpu_wrong_numa", "gpu": 1}, {"kind": "ecc_uncorrectable", "gpu": 4, "count": 2}]),
    ("mlx5_1 port down; low bandwidth on mlx5_3",
     [{"kind": "ib_port_down", "device": "mlx5_1"}, {"kind": "ib_low_bandwidth", "device": "mlx5_3"}]),
    ("NCCL bus bandwidth low with wrong results; driver drifted",
     [{"kind": "nccl_low_bw", "busbw_gbs": 150.0}, {"kind": "nccl_wrong", "count": 3},
      {"kind": "version_drift", "component": "driver", "version": "535.161.08"}]),
)

SIM_SWITCHES = """\
# Simulated machines (`clusterctl virtual up`): reached over SSH like production, as the unprivileged
# deploy user with sudo, with the key pair and known_hosts that `virtual up` writes under .sim/ssh/.
ansible_user: deploy
ansible_become: true
ansible_python_interpreter: /usr/bin/python3
ansible_ssh_private_key_file: "{{ inventory_dir }}/.sim/ssh/id_ed25519"
ansible_ssh_common_args: "-o UserKnownHostsFile={{ inventory_dir }}/.sim/ssh/known_hosts -o StrictHostKeyChecking=yes"
# Hardware the stub tools print (defaults per gpu_model in sim/hosts/hardware.py; state only
# differences) and the seconds every stub call takes (1.0 for the preflight fan-out benchmark).
sim_hardware: {}
sim_command_delay_s: 0.0
# The agent listens on the host's own loopback address. It reads its GPUs through NVML as on a GPU node: the
# package index's nvidia-ml-py is a stand-in answering from the file `virtual up` writes from the host's
# hardware (sim/nvml_standin).
eas_agent_listen: "{{ ansible_host }}:9105"
# Machines share this network namespace: each Consul agent listens on its machine's own address, and so
# does each edge's /metrics (the default 127.0.0.1:9180 would be one port for every edge).
consul_http_addr: "{{ ansible_host }}:8500"
eas_edge_admin_listen: "{{ ansible_host }}:9180"
# The machines inherit this host's descriptor limit (hard 20000 on the development host): HAProxy needs about
# two per connection and exits at start when its maxconn does not fit.
edge_balancer_maxconn: 4000
# Nothing leaves loopback: chrony's source is the package server's address (no NTP answers there), not a pool.
chrony_pools: []
chrony_servers: [127.0.255.1]
"""

SOURCES_HEADER = """\
# Package sources (`clusterctl virtual up` serves them on loopback: sim/hosts/repos.py): stand-ins of NVIDIA's
# and HashiCorp's apt repositories and a local package index. Only these values differ from a real site's;
# the roles add and use them exactly as the vendors' (Debian's own packages come from Debian's archive).
"""


class _LintCleanDumper(yaml.SafeDumper):
    """Sequences indented under their key, as ansible-lint's yaml rule (yamllint) wants them in an inventory."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, False)


def sources_yaml() -> str:
    from sim.hosts import repos

    # width: PyYAML breaks at the first space past it, keeping lines within ansible-lint's 160; a long value is
    # folded at its spaces, which YAML reads back as the same single spaces
    return SOURCES_HEADER + yaml.dump(repos.inventory_values(), Dumper=_LintCleanDumper, sort_keys=False, width=100)


@dataclass(frozen=True)
class PlannedHost:
    name: str
    rack: str
    address: str
    roce: bool
    scenario: tuple[str, list[dict]] | None


def nics(gpu_model: str, roce: bool) -> list[dict]:
    out = []
    for i, bus in enumerate(NIC_BUSES[gpu_model]):
        out.append({
            "device": f"mlx5_{i}",
            "netdev": f"enp{bus}s0np0" if roce else f"ibp{bus}s0",
            "link_layer": "ethernet" if roce else "infiniband",
            "rate_gbps": NIC_RATE[gpu_model],
            "numa_node": 0 if i < 2 else 1,
            "gpu": 2 * i,
        })
    return out


def plan(nodes: int, racks: int, fabric: str, faults: str, net: int = 0) -> list[PlannedHost]:
    if nodes < 1 or racks < 1 or racks > nodes:
        raise ValueError(f"need 1 <= racks ({racks}) <= nodes ({nodes})")
    if racks > 254 or math.ceil(nodes / racks) > 240:
        raise ValueError("at most 254 racks of 240 nodes (loopback addresses 127.0.R.10-249)")
    if not 0 <= net <= 254:
        raise ValueError(f"net {net}: the second octet of 127.<net>.R.N must be 0-254")
    per_rack = math.ceil(nodes / racks)
    hosts = []
    for index in range(nodes):
        rack, slot = divmod(index, per_rack)
        roce = fabric == "roce" or (fabric == "mixed" and rack == racks - 1 and racks > 1)
        hosts.append(PlannedHost(f"r{rack + 1:02d}n{slot + 1:02d}", f"r{rack + 1:02d}",
                                 f"127.{net}.{rack + 1}.{11 + slot}", roce, None))
    if faults == "default" and nodes > 1:
        faulty = min(len(FAULT_SCENARIOS), max(3, nodes // 4), nodes - 1)
        step = (nodes - 1) / faulty
        for k in range(faulty):
            index = 1 + int(k * step)
            hosts[index] = dataclasses.replace(hosts[index], scenario=FAULT_SCENARIOS[k])
    return hosts


# The virtual cluster's one Consul server runs on its first node, on purpose, and says so (cluster.servers):
# its GPUs and vLLM are stand-ins, its tokens throwaway, and a machine of its own would cost CI a booted system.
COLOCATED_SERVER = """\
# On purpose: root on a server reads every Consul token (docs/decisions/0038-dedicated-consul-servers.md).
consul_servers_running_ius:
  {host}: virtual cluster, simulated GPUs and vLLM, throwaway tokens; no machine of its own for the server
"""


def edge_placement(hosts: list[PlannedHost], net: int = 0) -> tuple[list[PlannedHost], str]:
    """The edges and the balancer's address: two edges (the fewest that can take over from each other), on the
    first node of the first and of the last rack (one rack: its first two nodes), sharing those machines rather
    than booting machines of their own (CI has two cores: a machine per edge and balancer would add three
    booted systems for two small processes); the balancer runs on the first edge's machine, on an address of
    its own below the first node's (127.<net>.1.5:8080), since the edge there holds the node's address."""
    firsts = list({h.rack: h for h in reversed(hosts)}.values())[::-1]
    edges = [firsts[0], firsts[-1]] if len(firsts) > 1 else hosts[:2]
    return edges, f"127.{net}.1.5:{BALANCER_PORT}"


def _flow(value) -> str:
    """One YAML flow item: {kind: nvlink_down, gpus: [2, 3]}."""
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1000).strip()


def render(nodes: int, racks: int, gpu_model: str = "h100-sxm", fabric: str = "ib",
           faults: str = "default", net: int = 0) -> dict[str, str]:
    """{relative path: text} of the inventory."""
    if gpu_model not in GPU_MODELS:
        raise ValueError(f"unknown GPU model {gpu_model!r} (one of {', '.join(GPU_MODELS)})")
    if fabric not in FABRICS:
        raise ValueError(f"unknown fabric {fabric!r} (one of {', '.join(FABRICS)})")
    hosts = plan(nodes, racks, fabric, faults, net)
    lines = [
        f"# A virtual inventory: {plural(nodes, 'node')} of 8x {gpu_model} in {plural(racks, 'rack')} "
        f"({'InfiniBand' if fabric == 'ib' else 'RoCE' if fabric == 'roce' else 'InfiniBand, last rack RoCE'}).",
        "# Written by `clusterctl virtual create`; addresses are loopback (127.0.0.0/8) so simulated services",
        "# never leave this machine. `clusterctl virtual up -i DIR` creates the simulated hosts.",
        "all:",
        "  children:",
    ]
    for rack in dict.fromkeys(h.rack for h in hosts):
        lines += [f"    rack_{rack}:", "      hosts:"]
        lines += [f"        {h.name}: {{ansible_host: {h.address}}}" for h in hosts if h.rack == rack]
    roce_hosts = [h.name for h in hosts if h.roce]
    if roce_hosts and len(roce_hosts) < len(hosts):
        lines += ["    roce:", "      hosts:"] + [f"        {name}:" for name in roce_hosts]
    lines += ["    consul_servers:", "      hosts:", f"        {hosts[0].name}:", "      vars:",
              *(f"        {line}" for line in COLOCATED_SERVER.format(host=hosts[0].name).splitlines())]
    edge_hosts, balancer = edge_placement(hosts, net)
    lines += ["    edges:", "      hosts:"] + [f"        {h.name}:" for h in edge_hosts]
    lines += ["    balancers:", "      hosts:", f"        {edge_hosts[0].name}: {{edge_balancer_listen: '{balancer}'}}"]
    default_roce = fabric == "roce"
    files = {
        "hosts.yml": "\n".join(lines) + "\n",
        "group_vars/all.yml": f"gpu_model: {gpu_model}\ngpu_count: 8\niu_size: 4\n"
        + _nic_yaml(nics(gpu_model, default_roce)) + "\n" + SIM_SWITCHES + "\n" + sources_yaml() + "\n"
        + consul_security.render(),
        ".gitignore": ".sim/\n",
    }
    if roce_hosts and not default_roce:
        files["group_vars/roce.yml"] = "# RoCE hosts: ConnectX-7 ports in Ethernet mode (DCQCN applies).\n" + _nic_yaml(
            nics(gpu_model, True))
    for host in hosts:
        if host.scenario is None:
            continue
        summary, fault_list = host.scenario
        fault_list = list(fault_list)
        if host.roce and any(f["kind"] == "cstates_enabled" for f in fault_list):
            fault_list.append({"kind": "dcqcn_off"})
            summary += "; DCQCN off"
        files[f"host_vars/{host.name}.yml"] = (
            f"# Injected hardware faults (preflight must catch them): {summary}.\n"
            + "sim_faults:\n" + "".join(f"  - {_flow(f)}\n" for f in fault_list)
        )
    return files


def _nic_yaml(nic_list: list[dict]) -> str:
    return "rdma_nics:\n" + "".join(f"  - {_flow(nic)}\n" for nic in nic_list)


def write(directory: Path, nodes: int, racks: int, gpu_model: str = "h100-sxm", fabric: str = "ib",
          faults: str = "default", force: bool = False, net: int = 0) -> list[Path]:
    """Write the inventory under ``directory``; an existing inventory there is replaced only with force."""
    files = render(nodes, racks, gpu_model, fabric, faults, net)
    if (directory / "hosts.yml").exists():
        if not force:
            raise FileExistsError(f"{directory / 'hosts.yml'} exists (use --force to replace the inventory)")
        for old in [*(directory / "host_vars").glob("*.yml"), *(directory / "group_vars").glob("*.yml")]:
            old.unlink()
    written = []
    for rel, text in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
