"""``clusterctl demo``: the whole toolkit end to end on a temporary virtual cluster, offline.

Steps, each the real command or library a cluster uses; only the hosts are simulated:

1. ``virtual create`` + ``virtual up``: N simulated GPU nodes, one of them with a broken NVLink pair (``topo -m``
   and ``nvidia-smi nvlink -s`` show it) and a GPU in thermal slowdown, and the
   package sources they install from (the stand-in NVIDIA/HashiCorp apt repositories and package index);
2. ``clusterctl provision``: every role for real, in stop-on-failure batches, as on a real host: packages
   from those sources, ``consul.service`` on every machine (the inventory's ``consul_servers`` machine as
   the server, the others as client agents joined to it) with ACLs on (default deny), the least-privilege
   tokens, every new IU in maintenance, and the ``vllm-iu@N`` and ``eas-agent`` units started;
3. the IUs answer ``/health`` (the stand-in vLLM the role installed, run by ``vllm-iu@N``); the catalog
   lists every IU, registered by its node's agent from the ``/etc/consul.d`` files the role rendered, in
   maintenance;
4. every node's ``eas-agent.service`` publishes its scores;
5. ``clusterctl preflight --release``: the faulty node FAILs, healthy IUs leave maintenance;
6. ``eas-edge`` (a process, the deployable router) in front of the IUs, following every agent's pushed
   scores and announcing each request it routes to that IU's node agent (the announce channel); the
   production request mix is sent to it over HTTP for ``--duration`` seconds, with a live table of scores,
   latencies and the edge's metrics.

Nothing on the nodes is started by the demo: what serves is what provisioning started. Every process the
demo starts itself (the edge) is stopped by PID at the end (or on Ctrl-C); the temp dir is removed unless
--keep.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.rule import Rule
from rich.text import Text

from cluster import load_cluster
from cluster.model import Cluster, Node
from common.errors import ClusterctlError
from common.text import plural
from demo.traffic import DemoEdge, edge_metrics
from sim.processes import ProcessSet, tail

# The demo's machines live on 127.42.R.N, not the default 127.0.R.N of `clusterctl virtual create`: a demo then
# runs beside a virtual inventory that is up (a developer's, or the test suite's machine tests) instead of
# failing on its addresses being taken.
DEMO_NET = 42
# The faulty node's faults: nvlink_down FAILs gpu_topology (the pair's IU), nccl, gpu_bandwidth (D2D) and nvlink
# (NVLINK_INACTIVE: GPU2's and GPU3's links <inactive> in nvidia-smi nvlink -s), and dcgm_diag WARNs its
# DCGM#198 cross-check; gpu_throttle FAILs gpu_throttle (THROTTLE_ACTIVE). Step 5 prints every FAIL.
FAULTY_NODE_FAULTS = [{"kind": "nvlink_down", "gpus": [2, 3]}, {"kind": "gpu_throttle", "gpu": 5}]
# --debug: a bug in a step prints its traceback into the demo log instead of one line (CI keeps only the log)
CLUSTERCTL = [sys.executable, "-m", "cli.main", "--debug"]


class DemoError(ClusterctlError):
    exit_code = 1


def run(console: Console, nodes: int, racks: int, duration: float, rate: float | None, keep: bool,
        seed: int) -> None:
    """Run the whole scenario on ``console`` (the CLI's, cli/app.py); ``clusterctl demo``
    (cli/commands/demo.py) checks the options and calls this."""
    workdir = Path(tempfile.mkdtemp(prefix="clusterctl-demo-"))
    (workdir / "logs").mkdir()
    processes = ProcessSet(workdir / "logs")
    inventory = workdir / "inventory"
    started = time.monotonic()
    try:
        Demo(inventory, workdir, processes, seed, console).run(nodes, racks, duration, rate)
        console.print(Rule(f"demo finished in {time.monotonic() - started:.0f}s"))
    finally:
        processes.stop()
        if (inventory / "hosts.yml").exists():
            from sim.hosts import lifecycle

            lifecycle.down(str(inventory))
        if keep:
            console.print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step_heading(title: str, width: int) -> Rule | Group:
    """A step's heading: the title inside a rule when it fits the width, else a plain rule over the title on
    its own (wrapped) lines; a rule cuts a longer title to "…" (an 80-column CI log lost half of two titles)."""
    heading = Text(title, style="bold")
    if len(title) + 6 <= width:  # rich's rule keeps "─ " and " ─" around the title
        return Rule(heading)
    return Group(Rule(), heading)


class Demo:
    def __init__(self, inventory: Path, workdir: Path, processes: ProcessSet, seed: int, console: Console):
        self.inventory, self.workdir, self.processes, self.seed = inventory, workdir, processes, seed
        self.console = console
        self.consul_addr = ""  # the server machine's HTTP API, known once the inventory is written
        self.tokens: dict[str, str] = {}  # operator and edge tokens from the inventory's (throwaway) secrets

    def step(self, title: str) -> None:
        self.console.print(step_heading(title, self.console.width))

    def run(self, nodes: int, racks: int, duration: float, rate: float | None) -> None:
        cluster = self.make_cluster(nodes, racks)
        faulty = list(cluster.nodes())[-1]
        self.provision()
        self.await_inference_units(cluster)
        self.await_agent_registrations(cluster)
        self.await_agents(cluster)
        released = self.preflight(cluster, faulty)
        self.route_traffic(cluster, released, duration, rate)

    # -- 1. simulated hosts -----------------------------------------------------------------------
    def make_cluster(self, nodes: int, racks: int) -> Cluster:
        from sim.hosts import create as create_inventory
        from sim.hosts import lifecycle

        self.step(f"1/6 virtual cluster: {plural(nodes, 'node')} in {plural(racks, 'rack')}")
        create_inventory.write(self.inventory, nodes, racks, fabric="mixed", faults="none", net=DEMO_NET)
        faulty = create_inventory.plan(nodes, racks, "mixed", "none", DEMO_NET)[-1].name
        (self.inventory / "host_vars").mkdir(exist_ok=True)
        (self.inventory / "host_vars" / f"{faulty}.yml").write_text(
            "# Injected by clusterctl demo: an NVLink pair down and a GPU in thermal slowdown; preflight must catch both.\n"
            "sim_faults:\n" + "".join(f"  - {json.dumps(f)}\n" for f in FAULTY_NODE_FAULTS)
        )
        self.configure_consul(faulty)
        cluster = load_cluster(self.inventory)
        result = lifecycle.up(str(self.inventory))
        self.console.print(f"{len(result.hosts)} machines up in {result.seconds:.2f}s; [red]{faulty}[/] has NVLink "
                           "GPU2-GPU3 down (their links inactive) and GPU 5 in HW thermal slowdown")
        return cluster

    def configure_consul(self, faulty: str) -> None:
        """Inventory values only: the controller's tools read the operator token from a 0600 file
        (``consul_token_file``); every machine's agent listens on its own address (the inventory's)."""
        group_vars = self.inventory / "group_vars" / "all.yml"
        secrets = yaml.safe_load(group_vars.read_text())
        self.tokens = {"operator": secrets["consul_token"], "edge": secrets["consul_edge_token"],
                       "announce": secrets["eas_agent_announce_token"]}
        hosts = yaml.safe_load((self.inventory / "hosts.yml").read_text())
        servers = list(hosts["all"]["children"]["consul_servers"]["hosts"])
        addresses = {name: spec["ansible_host"] for group in hosts["all"]["children"].values()
                     for name, spec in (group.get("hosts") or {}).items() if spec}
        if not servers or servers[0] == faulty:
            raise DemoError(f"the inventory's consul_servers group {servers} must name a healthy node")
        self.consul_addr = f"{addresses[servers[0]]}:8500"
        token_file = self.write_secret("consul.token", self.tokens["operator"])
        with open(group_vars, "a") as vars_file:
            vars_file.write("\n# The demo: the operator token for preflight and the playbooks in a 0600 file.\n"
                            f"consul_datacenter: dc1\nconsul_token_file: {token_file}\n")

    def write_secret(self, name: str, text: str) -> Path:
        path = self.workdir / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text + "\n")
        return path

    # -- 2. provisioning --------------------------------------------------------------------------
    def provision(self) -> None:
        # A canary host first, then the rest: the default 1,10%,50%,100% adds batches that 4 nodes don't need.
        # (Before them, the Consul server's own play; after them, the servers' one-at-a-time reboots.)
        self.step("2/6 clusterctl provision (site.yml for real: the Consul server first, a canary batch of 1, "
                  "then 100%)")
        # --allow-reboot: the nodes boot with an older driver than the pin; they restart into the pinned one
        # (Fabric Manager starts only then).
        self.clusterctl("provision", "-i", str(self.inventory), "--batches", "1,100%", "--allow-reboot",
                        "--run-dir", str(self.workdir / "runs"),
                        expect=(0,), what="provisioning")

    def clusterctl(self, *args: str, expect: tuple[int, ...], what: str) -> int:
        import subprocess

        code = subprocess.run([*CLUSTERCTL, *args], stdin=subprocess.DEVNULL).returncode
        if code not in expect:
            raise DemoError(f"{what} exited {code} (expected {' or '.join(map(str, expect))})")
        return code

    # -- 3. inference units and their Consul services ---------------------------------------------
    def await_inference_units(self, cluster: Cluster) -> None:
        self.step("3/6 the IUs that provisioning started (vllm-iu@N: the stand-in vLLM, continuous batching)")
        for node in cluster.nodes():
            for iu in node.ius:
                self.wait_http(f"http://{node.address}:{iu.port}/health", f"vllm-iu@{iu.index} of {node.name}")
        self.console.print(f"{sum(len(n.ius) for n in cluster.nodes())} IU servers answering /health")

    def await_agent_registrations(self, cluster: Cluster) -> None:
        """Each node's agent registered its IUs from /etc/consul.d and synced them to the server; the
        role put every new IU into maintenance. Nothing is registered by hand: this only reads the catalog."""
        expected = {iu.id for n in cluster.nodes() for iu in n.ius}
        seen: dict[str, bool] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            from consul_io import layout

            seen = {e["Service"]["ID"]: any(c["CheckID"].startswith(layout.SERVICE_MAINT_PREFIX) for c in e["Checks"])
                    for e in self.consul_io().health_service()[1]}
            if set(seen) == expected and all(seen.values()):
                break
            time.sleep(0.5)
        else:
            raise DemoError(f"the catalog at {self.consul_addr} lists {sorted(seen)} "
                            f"(in maintenance: {sorted(k for k, v in seen.items() if v)}); "
                            f"expected every IU {sorted(expected)}, all in maintenance")
        self.console.print(f"{len(seen)} vllm-iu services registered by the nodes' agents from /etc/consul.d, "
                      "all in maintenance")

    def consul_io(self):
        """The server's HTTP API with the operator token (ACLs are on, default deny)."""
        from consul_io.client import ConsulIO

        return ConsulIO(self.consul_addr, token=self.tokens["operator"], timeout_s=5.0)

    # -- 4. agents --------------------------------------------------------------------------------
    def await_agents(self, cluster: Cluster) -> None:
        self.step("4/6 eas-agent.service on every node (installed and configured by the eas_agent role)")
        for node in cluster.nodes():
            self.wait_http(f"http://{node.settings.agent.listen}/scores", f"eas-agent.service on {node.name}")
        self.console.print(f"{len(list(cluster.nodes()))} agents publishing to Consul")

    # -- 5. preflight -----------------------------------------------------------------------------
    def preflight(self, cluster: Cluster, faulty: Node) -> list[str]:
        self.step("5/6 clusterctl preflight --release")
        report = self.workdir / "preflight.json"
        self.clusterctl("preflight", "-i", str(self.inventory), "--release", "--json", str(report),
                        "--state-dir", str(self.workdir / "preflight-state"), expect=(1,),
                        what="preflight (the injected fault must FAIL)")
        if not report.is_file():  # exit 1 without a report: the run crashed (its traceback is above)
            raise DemoError(f"preflight exited 1 but wrote no report {report}: it crashed, see the traceback above")
        results = json.loads(report.read_text())["results"]
        caught = [r for r in results if r["verdict"] == "FAIL" and r["node"] == faulty.name]
        wrong = [r for r in results if r["verdict"] == "FAIL" and r["node"] != faulty.name]
        if not caught or wrong:
            raise DemoError(f"preflight should FAIL only {faulty.name}; FAILs: "
                            f"{[(r['node'], r['check']) for r in caught + wrong]}")
        from consul_io import layout

        expected = sorted(iu.id for n in cluster.nodes() if n.name != faulty.name for iu in n.ius)
        # Each node's agent syncs its maintenance change to the server a moment after preflight's call.
        deadline = time.monotonic() + 15
        while True:
            _, health = self.consul_io().health_service()
            released = sorted(e["Service"]["ID"] for e in health
                              if not any(layout.is_maintenance_check(c["CheckID"]) for c in e["Checks"]))
            if released == expected or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if released != expected:
            raise DemoError(f"released IUs {released}, expected {expected}")
        for result in caught:
            self.console.print(Text.assemble(("FAIL", "red"), f" {faulty.name}: {result['check']}: {result['reason']}"))
        self.console.print(Text(f"released from maintenance: {', '.join(released)}; {faulty.name} stays out of rotation"))
        return released

    # -- 6. traffic -------------------------------------------------------------------------------
    def route_traffic(self, cluster: Cluster, released: list[str], duration: float, rate: float | None) -> None:
        from cli.views.scores import rows
        from consul_io.client import ConsulIO
        from edge.pool import ConsulWatcher, PoolView

        rate = rate or 0.8 * len(released)
        edge_url = self.start_edge(cluster)
        self.step(f"6/6 routing the production mix at {rate:.1f} req/s for {duration:.0f}s through eas-edge")
        view = PoolView()
        watcher = ConsulWatcher(view, ConsulIO(self.consul_addr, token=self.tokens["edge"]), wait_s=2.0).start()
        expected = {iu.id: (n.rack, n.name) for n in cluster.nodes() for iu in n.ius}
        edge = DemoEdge(edge_url, rate, seed=self.seed).start()
        end = time.monotonic() + duration
        try:
            with Live(console=self.console, refresh_per_second=2, transient=False) as live:
                while time.monotonic() < end:
                    live.update(routing_panels(edge.summary(), edge_metrics(edge_url),
                                               rows(view, expected, time.time()), end - time.monotonic(),
                                               self.console.width))
                    dead = [c.name for c in self.processes.failed()]
                    if dead:
                        raise DemoError(f"{', '.join(dead)} exited early; see logs with --keep")
                    time.sleep(0.5)
        finally:
            edge.stop()
            watcher.stop()
            # A blocking query still open when Consul is stopped would end in a "consul watch failed"
            # line after the demo finished: wait for the watch threads to notice the stop first.
            for thread in watcher.threads:
                thread.join(timeout=watcher.wait_s + 5)
        summary = edge.summary(window_s=duration)
        self.console.print()
        self.console.print(Panel(Text(latency_line(summary)), title="whole run"))
        if summary["completed_total"] == 0:
            raise DemoError("no request completed")
        unreleased = set(summary["sent_to"]) - set(released)
        if unreleased:
            raise DemoError(f"requests were routed to IUs still in maintenance: {sorted(unreleased)}")

    def start_edge(self, cluster: Cluster) -> str:
        """eas-edge as a process, on loopback, following the agents (the port of eas_agent_listen)."""
        listen = f"127.0.0.1:{free_port()}"
        agent_port = str(next(iter(cluster.nodes())).settings.agent.listen).rsplit(":", 1)[1]
        edge = str(Path(sys.executable).with_name("eas-edge"))
        config = self.workdir / "edge.yml"  # the edge's tokens go in files, never on a command line
        config.write_text(yaml.safe_dump({
            "consul": {"address": self.consul_addr,
                       "token_file": str(self.write_secret("edge.token", self.tokens["edge"]))},
            # the agents hold the same token (role eas_agent, eas_agent_announce_token): each request routed is
            # announced to its node's agent, whose pushed scores then count it for every edge
            "announce": {"token_file": str(self.write_secret("announce.token", self.tokens["announce"]))},
        }))
        self.processes.start("eas-edge", [edge, "--config", str(config), "--listen", listen,
                                          "--agent-port", agent_port, "--log-level", "warning"])
        self.wait_http(f"http://{listen}/healthz", "eas-edge (a routable IU)")  # 503 until an IU is routable
        return f"http://{listen}"

    # -- helpers ----------------------------------------------------------------------------------
    def wait_http(self, url: str, what: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        logs = "\n".join(f"{c.name}: {tail(c.log, 3)}" for c in self.processes.children)
        raise DemoError(f"{what} not answering at {url} after {timeout_s:.0f}s\n{logs}")


def routing_panels(summary: dict, metrics_line: str, score_rows: list[dict], left_s: float, width: int) -> Group:
    """Step 7's live view: the clients' latencies through eas-edge and the edge's own /metrics first (the
    point of the step, never pushed off a short terminal by the table), then the scores laid out for the
    terminal's width."""
    from cli.views.scores import table

    return Group(
        Panel(Text(latency_line(summary) + "\n" + metrics_line), title=f"edge ({max(0, left_s):.0f}s left)",
              title_align="left"),
        table(score_rows, "IU scores (drain: seconds until free)", width),
    )


def latency_line(s: dict) -> str:
    def ms(value):
        return "-" if value is None else f"{value * 1000:.0f} ms"

    modes = ", ".join(f"{k} {v}" for k, v in sorted(s["pick_modes"].items())) or "-"
    return (f"last {s['window_s']:.0f}s: {s['completed_window']} done  TTFT p50 {ms(s['ttft_p50_s'])} "
            f"p95 {ms(s['ttft_p95_s'])}  e2e p50 {ms(s['e2e_p50_s'])} p95 {ms(s['e2e_p95_s'])}  |  "
            f"total {s['completed_total']} done, {s['inflight']} in flight, {s['errors']} errors, "
            f"{s['unroutable']} unroutable  |  pick: {modes}")
