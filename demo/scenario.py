"""``clusterctl demo``: the whole toolkit end to end on a temporary virtual cluster (offline once the machines'
image is cached; its first build fetches Debian packages).

Steps, each the real command or library a cluster uses; only the hosts are simulated:

1. ``virtual create`` + ``virtual up``: N simulated GPU nodes, one of them with a broken NVLink pair (``topo -m``
   and ``nvidia-smi nvlink -s`` show it) and a GPU in thermal slowdown, and the
   package sources they install from (the stand-in NVIDIA/HashiCorp apt repositories and package index);
2. ``clusterctl provision``: every role for real, in stop-on-failure batches (a canary node, then the rest; two
   nodes in one batch), as on a real host: packages
   from those sources, ``consul.service`` on every machine (the inventory's ``consul_servers`` machine as
   the server, the others as client agents joined to it) with ACLs on (default deny), the least-privilege
   tokens, every new IU in maintenance, and the ``vllm-iu@N`` and ``eas-agent`` units started;
3. the IUs answer ``/health`` (the stand-in vLLM the role installed, run by ``vllm-iu@N``); the catalog
   lists every IU, registered by its node's agent from the ``/etc/consul.d`` files the role rendered, in
   maintenance;
4. every node's ``eas-agent.service`` publishes its scores;
5. ``clusterctl preflight --release``: the faulty node FAILs, healthy IUs leave maintenance;
6. the production request mix, sent over HTTP for ``--duration`` seconds to the edges' load balancer
   (HAProxy, the ``edge_balancer`` role's) in front of the two edges (``eas-edge.service``, the ``eas_edge``
   role's), each following every agent's pushed scores and announcing each request it routes to that IU's
   node agent (the announce channel); a live table of scores, latencies and the edges' metrics;
7. ``clusterctl loadtest``: the production mix, open loop, for a few seconds through the same balancer, each
   class judged against its p99 targets (a short run judges only the classes with enough answers);
8. ``clusterctl edge calibrate``: a short mixed load through the same balancer, and per released IU whether its
   published score told the wait its requests then had (bias, error, correlation: the verdict per unit).

Nothing on the nodes is started by the demo: what serves is what provisioning started, from inventory values
the demo adds before it (a throwaway client key, the debug headers that name the IU that answered). The temp
dir (inventory, secrets) is removed unless --keep. The evidence it points at on the way (provisioning's events, the preflight
run) is kept under ``.state/demo/`` in the working directory, as preflight and provision keep theirs under
``.state/``; the ending names it, says what was shown, whether the numbers met their targets and what to type
next (:mod:`demo.view` draws it all).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import yaml
from rich.console import Console
from rich.live import Live
from rich.panel import Panel
from rich.rule import Rule
from rich.text import Text

from cluster import load_cluster
from cluster.model import Cluster, Node
from common.errors import ClusterctlError
from common.text import plural
from demo.traffic import DemoEdge, edge_counters
from demo.view import (
    Ending,
    ending,
    latency_lines,
    preflight_report,
    routing_panels,
    step_heading,
    turns_line,
)

# The demo's machines live on 127.42.R.N, not the default 127.0.R.N of `clusterctl virtual create`: a demo then
# runs beside a virtual inventory that is up (a developer's, or the test suite's machine tests) instead of
# failing on its addresses being taken.
DEMO_NET = 42
# The faulty node's faults: nvlink_down FAILs gpu_topology (the pair's IU), nccl, gpu_bandwidth (D2D) and nvlink
# (NVLINK_INACTIVE: GPU2's and GPU3's links <inactive> in nvidia-smi nvlink -s), and dcgm_diag WARNs its
# DCGM#198 cross-check; gpu_throttle FAILs gpu_throttle (THROTTLE_ACTIVE). Step 5's report lists every FAIL.
FAULTY_NODE_FAULTS = [{"kind": "nvlink_down", "gpus": [2, 3]}, {"kind": "gpu_throttle", "gpu": 5}]
FAULTS_IN_WORDS = "NVLink GPU2-GPU3 down, GPU 5 in HW thermal slowdown"
# Each step's title, short enough for a rule at 80 columns with the largest options (tests/unit/demo/test_scenario.py)
STEP_TITLES = {
    1: "1/8 virtual cluster: {nodes} in {racks}",
    2: "2/8 clusterctl provision: site.yml for real, {batches}",
    3: "3/8 the IUs provisioning started (vllm-iu@N, a stand-in vLLM)",
    4: "4/8 eas-agent.service on every node (the eas_agent role's)",
    5: "5/8 clusterctl preflight --release",
    6: "6/8 the production mix at {rate:.1f} req/s for {duration:.0f}s through HAProxy",
    7: "7/8 clusterctl loadtest: the production mix against its SLOs",
    8: "8/8 clusterctl edge calibrate: do the scores tell the waits?",
}
# Provisioning's batches: a canary node, then the rest; with two nodes both in one batch (a canary of one before
# one more is a second serial pass of every play for a single host: about a minute of the demo on two cores).
BATCHES = {"canary": ("1,100%", "a canary node, then the rest"), "one": ("100%", "both nodes in one batch")}
# Calibration: the production mix's prompts at half their lengths with ~12-token answers (a queue wait is the
# prefills'; a 614-token answer would stream for seconds), per released IU this many requests per second and
# about the clean answers its verdict needs (operate/calibrate.py: MIN_SAMPLES at the detection scale below).
CALIBRATE_PER_IU_RATE, CALIBRATE_PER_IU_REQUESTS, CALIBRATE_DETECT_SCALE = 3.0, 25, 4.0
# The load test: the production mix, per released IU this many requests/s, a class judged from this many answers
LOADTEST_PER_IU_RATE, LOADTEST_DURATION_S, LOADTEST_MIN_SAMPLES = 3.0, 8.0, 10
# Where each run's evidence stays (relative to the working directory, as preflight's and provision's defaults)
EVIDENCE_DIR = Path(".state") / "demo"
# --debug: a bug in a step prints its traceback into the demo log instead of one line (CI keeps only the log)
CLUSTERCTL = [sys.executable, "-m", "cli.main", "--debug"]


class DemoError(ClusterctlError):
    exit_code = 1


def run(console: Console, nodes: int, racks: int, duration: float, rate: float | None, keep: bool,
        seed: int) -> None:
    """Run the whole scenario on ``console`` (the CLI's, cli/app.py); ``clusterctl demo``
    (cli/commands/demo.py) checks the options and calls this."""
    workdir = Path(tempfile.mkdtemp(prefix="clusterctl-demo-"))
    EVIDENCE_DIR.mkdir(parents=True, exist_ok=True)
    evidence = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%dT%H%M%SZ-", time.gmtime()), dir=EVIDENCE_DIR))
    inventory = workdir / "inventory"
    started = time.monotonic()
    try:
        shown = Demo(inventory, workdir, seed, console, evidence).run(nodes, racks, duration, rate)
    finally:
        if (inventory / "hosts.yml").exists():
            from sim.hosts import lifecycle

            lifecycle.down(str(inventory))
        if keep:
            console.print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    cli = clusterctl_command()
    kept = (f"provisioning's events and the preflight run in {evidence} ({cli} preflight history --state-dir "
            f"{evidence / 'preflight'}); " + (f"the inventory, secrets and logs in {workdir}" if keep else
                                              "the machines' inventory is gone (--keep keeps it)"))
    console.print(Rule(f"demo finished in {time.monotonic() - started:.0f}s"))
    console.print(ending(replace(shown, clusterctl=cli, kept=kept)))


def clusterctl_command() -> str:
    """How to type clusterctl here: its name when the PATH finds this one, else its path (after `make demo`
    the venv is not on the PATH: .venv/bin/clusterctl)."""
    here = Path(sys.executable).with_name("clusterctl")
    found = shutil.which("clusterctl")
    if found and Path(found).resolve() == here.resolve():
        return "clusterctl"
    try:
        return str(here.relative_to(Path.cwd()))
    except ValueError:
        return str(here)


class Demo:
    def __init__(self, inventory: Path, workdir: Path, seed: int, console: Console, evidence: Path):
        self.inventory, self.workdir, self.seed = inventory, workdir, seed
        self.console, self.evidence = console, evidence
        self.consul_addr = ""  # the server machine's HTTP API, known once the inventory is written
        self.tokens: dict[str, str] = {}  # operator and edge tokens from the inventory's (throwaway) secrets
        self.client_key = ""  # the demo tenant's key: the edges hold only its hash (role eas_edge)

    def step(self, title: str) -> None:
        self.console.print(step_heading(title, self.console.width))

    def run(self, nodes: int, racks: int, duration: float, rate: float | None) -> Ending:
        cluster = self.make_cluster(nodes, racks)
        faulty = list(cluster.nodes())[-1]
        self.provision("one" if nodes == 2 else "canary")
        self.await_inference_units(cluster)
        self.await_agent_registrations(cluster)
        self.await_agents(cluster)
        released, codes = self.preflight(cluster, faulty)
        summary = self.route_traffic(cluster, released, duration, rate)
        self.loadtest(released)
        self.calibrate(released)
        to_faulty = sum(n for iu, n in summary["sent_to"].items() if iu in {i.id for i in faulty.ius})
        return Ending(faulty.name, FAULTS_IN_WORDS, codes, len(released), summary, to_faulty, "clusterctl", "")

    # -- 1. simulated hosts -----------------------------------------------------------------------
    def make_cluster(self, nodes: int, racks: int) -> Cluster:
        from sim.hosts import create as create_inventory
        from sim.hosts import lifecycle

        self.step(STEP_TITLES[1].format(nodes=plural(nodes, "node"), racks=plural(racks, "rack")))
        create_inventory.write(self.inventory, nodes, racks, fabric="mixed", faults="none", net=DEMO_NET)
        faulty = create_inventory.plan(nodes, racks, "mixed", "none", DEMO_NET)[-1].name
        (self.inventory / "host_vars").mkdir(exist_ok=True)
        (self.inventory / "host_vars" / f"{faulty}.yml").write_text(
            "# Injected by clusterctl demo: an NVLink pair down and a GPU in thermal slowdown; preflight must catch both.\n"
            "sim_faults:\n" + "".join(f"  - {json.dumps(f)}\n" for f in FAULTY_NODE_FAULTS)
        )
        self.configure_inventory(faulty)
        cluster = load_cluster(self.inventory)
        result = lifecycle.up(str(self.inventory))
        self.console.print(f"{len(result.hosts)} machines up in {result.seconds:.2f}s; [red]{faulty}[/] has "
                           f"{FAULTS_IN_WORDS} (injected: preflight must catch both)")
        return cluster

    def configure_inventory(self, faulty: str) -> None:
        """Inventory values only: the controller's tools read the operator token from a 0600 file
        (``consul_token_file``); every machine's agent listens on its own address (the inventory's); the edges
        take the demo tenant's client key and answer with the IU that served (their debug headers)."""
        from edge.auth import new_key

        group_vars = self.inventory / "group_vars" / "all.yml"
        secrets = yaml.safe_load(group_vars.read_text())
        self.tokens = {"operator": secrets["consul_token"], "edge": secrets["consul_edge_token"]}
        self.client_key = new_key()
        hosts = yaml.safe_load((self.inventory / "hosts.yml").read_text())
        servers = list(hosts["all"]["children"]["consul_servers"]["hosts"])
        # a host's address is in the group that defines it; the edges and balancers groups name the same
        # hosts again with their own settings only
        addresses = {name: spec["ansible_host"] for group in hosts["all"]["children"].values()
                     for name, spec in (group.get("hosts") or {}).items() if spec and "ansible_host" in spec}
        if not servers or servers[0] == faulty:
            raise DemoError(f"the inventory's consul_servers group {servers} must name a healthy node")
        self.consul_addr = f"{addresses[servers[0]]}:8500"
        token_file = self.write_secret("consul.token", self.tokens["operator"])
        with open(group_vars, "a") as vars_file:
            vars_file.write("\n# The demo: the operator token for preflight and the playbooks in a 0600 file.\n"
                            f"consul_datacenter: dc1\nconsul_token_file: {token_file}\n"
                            "# The demo's clients: one tenant's key (the edges keep its hash); each answer names the\n"
                            "# IU that served it, for the live table (internal ids: never on a production edge).\n"
                            + yaml.safe_dump({"eas_edge_client_keys": [{"tenant": "demo", "key": self.client_key}],
                                              "eas_edge_debug_headers": True}, sort_keys=False))

    def write_secret(self, name: str, text: str) -> Path:
        path = self.workdir / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text + "\n")
        return path

    # -- 2. provisioning --------------------------------------------------------------------------
    def provision(self, batches: str) -> None:
        # BATCHES: the default 1,10%,50%,100% adds batches that 4 nodes don't need. (Before them, the Consul
        # server's own play; after them, the servers' one-at-a-time reboots.)
        sizes, words = BATCHES[batches]
        self.step(STEP_TITLES[2].format(batches=words))
        # --allow-reboot: the nodes boot with an older driver than the pin; they restart into the pinned one
        # (Fabric Manager starts only then).
        self.clusterctl("provision", "-i", str(self.inventory), "--batches", sizes, "--allow-reboot", "--yes",
                        "--run-dir", str(self.evidence / "runs"),
                        expect=(0,), what="provisioning")

    def clusterctl(self, *args: str, expect: tuple[int, ...], what: str, capture: bool = False) -> str:
        """Run clusterctl; ``capture``: its stdout is returned instead of shown (laid out for this console's
        width and colours; its stderr, the live progress, still goes to the terminal)."""
        env = None
        if capture:
            env = {**os.environ, "COLUMNS": str(self.console.width)}
            if self.console.is_terminal and not self.console.no_color and sys.stderr.isatty():
                env["FORCE_COLOR"] = "1"
        done = subprocess.run([*CLUSTERCTL, *args], stdin=subprocess.DEVNULL, env=env, text=True,
                              stdout=subprocess.PIPE if capture else None)
        if done.returncode not in expect:
            if capture:  # all of it, for the reader to see what went wrong
                self.console.print(Text.from_ansi(done.stdout), end="", soft_wrap=True)
            raise DemoError(f"{what} exited {done.returncode} (expected {' or '.join(map(str, expect))})")
        return done.stdout or ""

    # -- 3. inference units and their Consul services ---------------------------------------------
    def await_inference_units(self, cluster: Cluster) -> None:
        self.step(STEP_TITLES[3])
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
        self.step(STEP_TITLES[4])
        for node in cluster.nodes():
            self.wait_http(f"http://{node.settings.agent.listen}/scores", f"eas-agent.service on {node.name}")
        self.console.print(f"{len(list(cluster.nodes()))} agents publishing to Consul")

    # -- 5. preflight -----------------------------------------------------------------------------
    def preflight(self, cluster: Cluster, faulty: Node) -> tuple[list[str], tuple[str, ...]]:
        """(the IUs released, the codes the faulty node FAILed with)."""
        self.step(STEP_TITLES[5])
        report = self.evidence / "preflight.json"
        shown = self.clusterctl("preflight", "-i", str(self.inventory), "--release", "--json", str(report),
                                "--state-dir", str(self.evidence / "preflight"), expect=(1,),
                                what="preflight (the injected fault must FAIL)", capture=True)
        self.console.print(Text.from_ansi(preflight_report(shown)), end="", soft_wrap=True)
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
        self.console.print(Text.assemble((f"{faulty.name} failed, as intended", "bold"), ": its IUs stay in "
                                         f"maintenance; released from maintenance: {', '.join(released)}"))
        codes = dict.fromkeys((r.get("evidence") or {}).get("code") or r["check"] for r in caught)
        return released, tuple(codes)

    # -- 6. traffic -------------------------------------------------------------------------------
    def route_traffic(self, cluster: Cluster, released: list[str], duration: float, rate: float | None) -> dict:
        from cli.views.scores import rows
        from consul_io.client import ConsulIO
        from edge.pool import ConsulWatcher, PoolView

        rate = rate or 0.8 * len(released)
        edge_url, admin_urls = self.edges()
        self.wait_http(f"{edge_url}/healthz", "the edges' load balancer (an edge with a routable IU)", timeout_s=90.0)
        self.refused_without_keys(cluster, released, edge_url)
        self.step(STEP_TITLES[6].format(rate=rate, duration=duration))
        view = PoolView()
        watcher = ConsulWatcher(view, ConsulIO(self.consul_addr, token=self.tokens["edge"]), wait_s=2.0).start()
        expected = {iu.id: (n.rack, n.name) for n in cluster.nodes() for iu in n.ius}
        edge = DemoEdge(edge_url, rate, seed=self.seed, api_key=self.client_key).start()
        end = time.monotonic() + duration
        try:
            with Live(console=self.console, refresh_per_second=2, transient=False) as live:
                while time.monotonic() < end:
                    live.update(routing_panels(edge.summary(), edge_counters(admin_urls),
                                               rows(view, expected, time.time()), end - time.monotonic(),
                                               # a line spare: the cursor's, below the view
                                               self.console.width, self.console.height - 1))
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
        self.console.print(Panel(Text(latency_lines(summary) + "\n" + turns_line(summary)), title="whole run",
                                 title_align="left"))
        if summary["completed_total"] == 0:
            raise DemoError("no request completed")
        unreleased = set(summary["sent_to"]) - set(released)
        if unreleased:
            raise DemoError(f"requests were routed to IUs still in maintenance: {sorted(unreleased)}")
        return summary

    # -- 7, 8. load test, calibration ------------------------------------------------------------
    def loadtest(self, released: list[str]) -> None:
        """``clusterctl loadtest`` through the balancer with the tenant's key, its table shown: an SLO missed or a
        class with too few answers to judge (exit 1) is its finding, not the demo's failure."""
        self.step(STEP_TITLES[7])
        edge_url, _ = self.edges()
        key = str(self.write_secret("client.key", self.client_key))
        shown = self.clusterctl("loadtest", "--endpoint", edge_url, "--api-key-file", key, "--rate",
                                f"{LOADTEST_PER_IU_RATE * len(released):g}", "--duration", f"{LOADTEST_DURATION_S:g}",
                                "--min-samples", str(LOADTEST_MIN_SAMPLES), "--seed", str(self.seed),
                                expect=(0, 1), what="loadtest", capture=True)
        self.console.print(Text.from_ansi(shown), end="", soft_wrap=True)

    def calibrate(self, released: list[str]) -> None:
        """``clusterctl edge calibrate`` through the balancer with the tenant's key, its table (the verdict per
        released IU) shown: a unit flagged or undecided (exit 1) is its finding, not the demo's failure."""
        from operate.scenario import load_scenario

        self.step(STEP_TITLES[8])
        mix = {"name": "production-prompts-short-answers", "classes": {
            k.name: {"share": k.share, "prompt_tokens": {"mean": round(k.prompt.mean / 2), "sigma": k.prompt.sigma},
                     "output_tokens": {"mean": 12, "sigma": 0.3}, "slo": {"ttft_p99_ms": k.slo.ttft_p99_ms}}
            for k in load_scenario().classes}}
        scenario = self.workdir / "calibrate-mix.yml"
        scenario.write_text(yaml.safe_dump(mix, sort_keys=False))
        requests = CALIBRATE_PER_IU_REQUESTS * len(released)
        shown = self.clusterctl("edge", "calibrate", "-i", str(self.inventory), "--api-key-file",
                                str(self.write_secret("client.key", self.client_key)), "--scenario", str(scenario),
                                "--rate", f"{CALIBRATE_PER_IU_RATE * len(released):g}", "--requests", str(requests),
                                "--max-requests", str(3 * requests), "--detect-scale", f"{CALIBRATE_DETECT_SCALE:g}",
                                expect=(0, 1), what="edge calibrate", capture=True)
        self.console.print(Text.from_ansi(shown), end="", soft_wrap=True)

    def edges(self) -> tuple[str, list[str]]:
        """Where the clients send (the inventory's balancer, as ``clusterctl loadtest`` finds it) and each edge's
        /metrics, from the inventory provisioning used."""
        from cluster import edges
        from cluster.ansible import inventory as inventories

        hosts = inventories.load_inventory(self.inventory).everyone
        found = edges.client_endpoint(hosts)
        if found is None:
            raise DemoError(f"{self.inventory / 'hosts.yml'}: no 'balancers' or 'edges' group to send to")
        return edges.url_of(found[1]), [edges.admin_url(e.host, hosts[e.host]) for e in edges.edges_of(hosts)]

    def refused_without_keys(self, cluster: Cluster, released: list[str], edge_url: str) -> None:
        """The edge answers 401 to a request without a client key, and an IU refuses one without its own key:
        the GPUs are reached through the edge only."""
        node, iu = next((n, iu) for n in cluster.nodes() for iu in n.ius if iu.id in released)
        for what, url in (("eas-edge", f"{edge_url}/v1/completions"),
                          (f"IU {iu.id}", f"http://{node.address}:{iu.port}/v1/completions")):
            request = urllib.request.Request(url, data=b"{}", method="POST", headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    status = answer.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            if status != 401:
                raise DemoError(f"{what} answered {status} to a request without a key (expected 401)")
        self.console.print("Without a key: eas-edge and the IUs answer 401 (clients need a key; the edge holds the IUs')")

    # -- helpers ----------------------------------------------------------------------------------
    def wait_http(self, url: str, what: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise DemoError(f"{what} not answering at {url} after {timeout_s:.0f}s")
