"""``clusterctl remediate``: bring one unhealthy inference unit back, or take its node out for repair, by an
action ladder in which every step is bounded, verified and logged.

==========  =====================================================  ==============================================
rung        what it does                                           verified by (each within its bound)
==========  =====================================================  ==============================================
drain       the unit into Consul maintenance (its own reason),     the ``_service_maintenance:<iu>`` check listed;
            then its requests in flight left to finish             ``vllm:num_requests_running`` 0 (or no answer)
restart     ``systemctl reset-failed`` + ``restart vllm-iu@N``     ``is-active`` and the unit's ``/health`` 200
gpu_reset   the scope (:mod:`operate.gpu_reset`): the unit's GPUs  as restart (every unit of the board, each
            where Fabric Manager runs, else the whole NVSwitch     released once healthy); a reset nvidia-smi
            board (every unit of the node drained, breaker for     refuses, or a fabric not Completed + Success
            the node); the units stopped, the NVML/DCGM clients    within ``fabric_wait_s``, goes to the next
            stopped and persistence mode off, one ``nvidia-smi     rung with its reason
            --gpu-reset``, all put back, the fabric waited for,
            the units started
fabric_     a fatal NVSwitch SXID in the unit's score body (or     as gpu_reset
reset       ``--from``), only as the first rung: every unit of the
            node drained (breaker for the node) and stopped,
            ``nvidia-fabricmanager.service`` restarted, the whole
            board reset, the fabric waited for, the units started
            (:mod:`operate.remediate_board`)
reboot      the breaker for the whole node, then                   as restart
            ``playbooks/node-reboot.yml`` on the node (its units
            drained, the reboot, the units that served released:
            :mod:`operate.remediate_reboot`)
repair      every unit of the node into maintenance ("node         each of them listed in maintenance
            marked for repair"), the record                        (the node stays out: people repair it)
            ``clusterctl/repair/<dc>/<node>`` in Consul KV
release     the unit's maintenance off (only a maintenance this    the maintenance check gone
            command set)
==========  =====================================================  ==============================================

The drain always runs first (or finds the unit already in maintenance); the ladder then starts at ``start``,
or, when none is given, at ``fabric_reset`` when the unit's score body names a fatal SXID, else at the rung the XID catalogue (:mod:`operate.xid_catalog`) names for the unit's latest
XID (``xid_last`` in its node's score body in Consul, counted only when its ``xid_last_at`` is younger than
``xid_max_age_s``; restart when it names none), and climbs one rung each
time the unit is not healthy within ``verify_s`` after one, or ``nvidia-smi`` refuses the GPU reset (NVIDIA's
answer that the reset cannot clear it now: the reboot can). A step that cannot be carried out (the host
unreachable, sudo refused, a program missing) **stops** the ladder: the unit stays drained and the outcome says
what it was left as; nothing further is tried on a host that does not do what it is told.

The breaker (:mod:`operate.remediate_breaker`) is judged from Consul before the drain and again before what
takes the whole node out (a board's GPU reset, the fabric reset, the reboot, the repair). Host commands: preflight's transport
and :func:`operate.drill_faults.run_on` (``sudo -n`` under ``ansible_become``); Consul: :mod:`consul_io`.
Without ``apply`` nothing is touched: :meth:`Remediation.plan` lists what would run.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from cluster.model import Cluster
from cluster.services import health_url
from common.errors import UsageError
from consul_io import layout
from operate.drill_faults import HostStepError, Target, run_on, start_commands
from operate.gpu_reset import FABRIC_MANAGER_UNIT, FABRIC_WAIT_S, GPU_CLIENT_UNITS
from operate.remediate_board import BoardSteps, fatal_sxid
from operate.remediate_breaker import Limits, judge
from operate.remediate_outcome import Outcome, Step, Stop
from operate.remediate_reboot import PLAYBOOK, RebootRun, node_maintenance
from operate.xid_catalog import RUNGS, XID_MAX_AGE_S, Catalog, first_rung, load_catalog, xid_last

REASON_PREFIX = "clusterctl remediate"
VERIFY_S = 300.0  # vLLM loads a 70B model's weights in minutes; the bound for a unit back is 5 minutes
CONSUL_SETTLE_S = 15.0  # a maintenance change reaches the catalog within a few anti-entropy rounds at worst
DRAIN_S = 120.0  # rolling-restart.yml's rolling_restart_drain_timeout_s: then the restart goes ahead anyway
POLL_S = 0.5
PROBE_TIMEOUT_S = 2.0
RUNNING = re.compile(r"(?m)^vllm:num_requests_running(?:\{[^}]*\})? ([0-9.e+]+)$")  # playbooks/tasks/inflight_drain.yml


def health_ok(url: str) -> bool:
    """vLLM's ``/health`` answers 200 (what the unit's Consul check asks)."""
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as answer:
            return answer.status == 200
    except OSError:
        return False


def in_flight(url: str) -> float:
    """Requests the unit is running (vLLM's ``vllm:num_requests_running`` summed over its labels); 0 when it does
    not answer: a unit that does not answer has nothing in flight to protect."""
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as answer:
            text = answer.read().decode(errors="replace")
    except OSError:
        return 0.0
    return sum(float(v) for v in RUNNING.findall(text))


def find_target(cluster: Cluster, name: str, become: dict[str, bool] | None = None) -> Target:
    """The IU named ``name`` (remediation acts on one unit; its node only at the repair rung)."""
    for node in cluster.nodes():
        for iu in node.ius:
            if iu.id == name:
                return Target(node, iu, bool((become or {}).get(node.name)))
    known = sorted(iu.id for iu in cluster.ius())
    raise UsageError(f"--target {name!r}: no such IU in the inventory (IUs: {', '.join(known[:8]) or '-'}"
                     f"{', ...' if len(known) > 8 else ''})")


@dataclass
class Remediation(BoardSteps):
    cluster: Cluster
    target: Target
    transport: object  # preflight.transport.Transport
    io: object  # consul_io.client.ConsulIO of the agent the target's units are registered on
    datacenter: str = layout.DEFAULT_DATACENTER
    limits: Limits = field(default_factory=Limits)
    start: str | None = None  # None: from the XID catalogue and the unit's score body
    reason: str = "unhealthy"
    verify_s: float = VERIFY_S
    settle_s: float = CONSUL_SETTLE_S
    drain_s: float = DRAIN_S
    log: Callable[[str], None] = lambda line: None
    probe: Callable[[str], bool] = health_ok
    running: Callable[[str], float] = in_flight
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    # node name, reason -> what the reboot playbook did (operate.remediate_reboot.PlaybookReboot); None: the
    # reboot rung cannot run here, which stops the ladder there
    reboot: Callable[[str, str], RebootRun] | None = None
    catalog: Catalog | None = None  # None: the shipped operate/xid_catalog.yml, read when it is needed
    xid_max_age_s: float = XID_MAX_AGE_S  # an older xid_last no longer picks the first rung
    wall_clock: Callable[[], float] = time.time  # unix s, to age the XID against the agent's stamps
    fabric_wait_s: float = FABRIC_WAIT_S  # after a reset, for every GPU's fabric Completed + Success

    def __post_init__(self):
        if self.start is not None and self.start not in RUNGS:
            raise UsageError(f"--from: unknown rung {self.start!r}; expected one of {', '.join(RUNGS)}")
        self.start_why = "named by the operator (--from)" if self.start is not None else ""
        self.iu = self.target.iu
        self.unit = self.target.unit
        self.url = health_url(self.target.node.address, self.iu.port)
        self.metrics_url = self.url.removesuffix("/health") + "/metrics"
        self.outcome = Outcome(self.iu.id, "planned", "")
        self.t0 = 0.0
        self.set_maintenance = False  # this command put the unit into maintenance, so it takes it out
        self.board_drained: list = []  # the board's other units this command put into maintenance for a reset
        self.fabric_fault: str | None = None  # the fatal SXID the unit's score body names
        self.reason_prefix = REASON_PREFIX

    # -- the plan ---------------------------------------------------------------------------------------
    def choose_start(self) -> str:
        """The first rung: the operator's, else the XID catalogue's for the unit's latest XID (read from Consul)."""
        if self.start is None:
            _, body = self.io.kv_read(layout.score_key(self.datacenter, self.target.node.name))
            self.fabric_fault = fatal_sxid(body, self.iu.id, self.wall_clock(), self.xid_max_age_s)
            if self.fabric_fault is not None:
                # before any XID: the GPUs behind the switch log XIDs too, and a reset alone leaves the fabric down
                self.start = "fabric_reset"
                self.start_why = (f"fabric_reset: its score body names a {self.fabric_fault} (the Fabric Manager "
                                  f"user guide: the GPUs and NVSwitches reset, Fabric Manager restarted)")
                self.outcome.start, self.outcome.start_why = self.start, self.start_why
                return self.start
            xid, seen = xid_last(body, self.iu.id, self.wall_clock(), self.xid_max_age_s)
            self.catalog = self.catalog or load_catalog()
            self.start, self.start_why = first_rung(self.catalog, xid, seen)
            self.start_why = f"from the XID catalogue: {self.start_why}"
        self.outcome.start, self.outcome.start_why = self.start, self.start_why
        return self.start

    def plan(self) -> list[str]:
        node, iu, unit = self.target.node.name, self.iu.id, self.unit
        self.choose_start()
        gpus = ",".join(str(g) for g in self.iu.gpus)
        lines = [f"breaker: at most {self.limits.max_unit_share:.0%} of the units and "
                 f"{self.limits.max_nodes_per_rack} node(s) per rack out of rotation, judged from Consul",
                 f"drain: {iu} into Consul maintenance ({REASON_PREFIX}: {self.reason}); verified listed within "
                 f"{self.settle_s:g} s; then up to {self.drain_s:g} s for its requests in flight to finish"]
        rungs = {"restart": f"restart: on {node}: systemctl reset-failed {unit}; systemctl restart {unit}",
                 "gpu_reset": f"gpu_reset: on {node}: GPUs {gpus} alone if {FABRIC_MANAGER_UNIT} is active, "
                              f"else every GPU of the NVSwitch board (every unit of {node} drained, the breaker "
                              f"judged for the node); the units stopped, {' and '.join(GPU_CLIENT_UNITS)} stopped "
                              f"and persistence mode off, nvidia-smi --gpu-reset, all put back, every reset GPU's "
                              f"fabric Completed + Success within {self.fabric_wait_s:g} s (nvidia-smi -q; a GPU "
                              f"without one is not waited for), the units started; a reset nvidia-smi refuses or a "
                              f"fabric not back goes to the next rung",
                 "fabric_reset": f"fabric_reset: the breaker judged for the whole node; every unit of {node} "
                                 f"drained and stopped, {' and '.join(GPU_CLIENT_UNITS)} stopped and persistence "
                                 f"mode off, systemctl restart {FABRIC_MANAGER_UNIT}, nvidia-smi --gpu-reset (every "
                                 f"GPU of the board), all put back, every GPU's fabric Completed + Success within "
                                 f"{self.fabric_wait_s:g} s, the units started; a reset refused or a fabric not "
                                 f"back goes to the next rung",
                 "reboot": f"reboot: the breaker judged for the whole node; playbooks/{PLAYBOOK} --limit {node} (every "
                           f"unit of {node} drained by Consul node maintenance, the reboot, the driver checked, the "
                           f"units that served released)",
                 "repair": f"repair: every unit of {node} into maintenance (node marked for repair), the record "
                           f"{layout.repair_key(self.datacenter, node)}; the breaker judged for the whole node"}
        lines.insert(1, f"first rung: {self.start_why}")
        for rung in self._rungs():
            check = (f"; healthy when active and {self.url} answers 200 within {self.verify_s:g} s, else the "
                     f"next rung" if rung != "repair" else "")
            lines.append(rungs[rung] + check)
        lines.append(f"release: {iu}'s maintenance off (only one this command set)")
        return lines

    # -- running it -------------------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock() - self.t0

    def note(self, rung: str, text: str) -> None:
        self.log(f"{self.now():7.1f} s  {rung}: {text}")

    def run(self) -> Outcome:
        self.t0 = self.clock()
        self.outcome.plan = self.plan()
        self.note("start", self.start_why)
        try:
            self._ladder()
        except Stop as stop:
            self.outcome.state, self.outcome.message = stop.state, stop.message
        except KeyboardInterrupt:
            self.outcome.state, self.outcome.message = "interrupted", "interrupted: nothing is undone"
        self.outcome.took_s = self.now()
        self.outcome.left = self._left()
        return self.outcome

    def _ladder(self) -> None:
        key = layout.repair_key(self.datacenter, self.target.node.name)
        if self.io.kv_read(key)[1] is not None:
            # its units' maintenance is the repair's: restarting one would put it back into rotation unrepaired
            raise Stop("refused", f"{self.target.node.name} is marked for repair ({key}): delete the record once "
                                  f"the node is repaired, then release its units with `clusterctl preflight --release`")
        self._breaker((self.iu.id,))
        self._drain()
        for rung in self._rungs():
            if rung == "repair":
                self._repair()
                raise Stop("repair", f"{self.target.node.name} marked for repair: {self.iu.id} did not come back")
            if rung == "reboot":
                self._reboot()
            elif rung in ("gpu_reset", "fabric_reset"):
                if not (self._gpu_reset() if rung == "gpu_reset" else self._fabric_reset()):
                    continue  # refused, or the fabric not back: the reset cannot clear it, the next rung can
            else:
                self._step(rung, self._restart)
            if self._verify(rung):
                self.outcome.healthy_s = self.now()
                self._release()
                self._release_board()
                self.outcome.state = "released"
                self.outcome.message = f"{self.iu.id} healthy after {rung} and back in rotation"
                return

    def _rungs(self) -> list[str]:
        """The rungs from the first one up; the fabric reset only as the first (remediate_board.py says why)."""
        return [r for r in RUNGS[RUNGS.index(self.start):] if r != "fabric_reset" or r == self.start]

    def _step(self, rung: str, action: Callable[[list[str]], None]) -> None:
        at, did = self.now(), []
        try:
            action(did)
        except HostStepError as exc:
            self.outcome.steps.append(Step(rung, at, self.now() - at, False, did, str(exc)))
            self.note(rung, f"FAILED: {exc}")
            raise Stop("stopped", f"{rung} could not be carried out: {exc}") from None
        self.outcome.steps.append(Step(rung, at, self.now() - at, True, did))
        self.note(rung, "; ".join(did))

    def _breaker(self, taking: tuple[str, ...]) -> None:
        _, entries = self.io.health_service()
        verdict = judge(self.cluster, entries, self.target.node.name, taking, self.limits)
        self.outcome.verdicts.append(verdict)
        self.note("breaker", verdict.reason)
        if verdict.open:
            raise Stop("breaker", verdict.reason)

    def _checks(self) -> dict[str, dict[str, dict]]:
        """IU id -> its checks (CheckID -> the check) as Consul lists them."""
        _, entries = self.io.health_service()
        return {(e.get("Service") or {}).get("ID"): {c.get("CheckID"): c for c in e.get("Checks") or []}
                for e in entries}

    def _wait(self, what: str, done: Callable[[], bool], bound_s: float) -> bool:
        deadline = self.clock() + bound_s
        while True:
            if done():
                return True
            if self.clock() >= deadline:
                self.note("wait", f"{what}: not within {bound_s:g} s")
                return False
            self.sleep(POLL_S)

    def _in_maintenance(self, iu: str) -> bool:
        return layout.maintenance_check(iu) in self._checks().get(iu, {})

    def _drain(self) -> None:
        at = self.now()
        check = self._checks().get(self.iu.id, {}).get(layout.maintenance_check(self.iu.id))
        if check is not None:
            notes = str(check.get("Notes") or "")
            self.set_maintenance = notes.startswith(REASON_PREFIX)  # a previous remediation's: ours to clear
            did = [f"already in maintenance ({notes or 'no reason given'})"
                   + ("" if self.set_maintenance else ": someone else's, left on at the end")]
        else:
            self.io.service_maintenance(self.iu.id, True, f"{REASON_PREFIX}: {self.reason}")
            self.set_maintenance = True
            if not self._wait(f"{self.iu.id}'s maintenance listed", lambda: self._in_maintenance(self.iu.id),
                              self.settle_s):
                self.outcome.steps.append(Step("drain", at, self.now() - at, False, [], "maintenance not listed"))
                raise Stop("stopped", f"drain: {self.iu.id}'s maintenance was not listed by Consul within "
                                      f"{self.settle_s:g} s")
            did = [f"{self.iu.id} in maintenance, listed after {self.now() - at:.1f} s"]
        since, zeros = self.now(), []

        def idle() -> bool:
            # twice in a row, POLL_S apart: an edge that had not yet seen the maintenance may have sent one more
            zeros.append(self.running(self.metrics_url) == 0)
            return zeros[-2:] == [True, True]

        if self._wait(f"{self.iu.id}'s requests in flight finished", idle, self.drain_s):
            did.append(f"nothing in flight after {self.now() - since:.1f} s")
        else:
            did.append(f"requests still in flight after {self.drain_s:g} s: going ahead (rolling-restart.yml does too)")
        self.outcome.steps.append(Step("drain", at, self.now() - at, True, did))
        self.note("drain", "; ".join(did))

    def _restart(self, did: list[str]) -> None:
        for argv in start_commands(self.unit, "restart"):
            run_on(self.target, self.transport, argv)
            did.append(" ".join(argv))

    def _active(self, unit: str | None = None) -> bool:
        result = run_on(self.target, self.transport, ("systemctl", "is-active", unit or self.unit), check=False)
        return result.ok and result.stdout.strip() == "active"

    def _verify(self, rung: str) -> bool:
        at = self.now()
        healthy = self._wait(f"{self.unit} active and {self.url} 200", lambda: self._active() and self.probe(self.url),
                             self.verify_s)
        detail = (f"healthy after {self.now() - at:.1f} s" if healthy
                  else f"not healthy within {self.verify_s:g} s: the next rung")
        self.outcome.steps.append(Step(f"verify {rung}", at, self.now() - at, healthy, [], detail))
        self.note(f"verify {rung}", detail)
        return healthy

    def _release(self) -> None:
        at = self.now()
        if not self.set_maintenance:
            did = [f"{self.iu.id}'s maintenance is someone else's: left on"]
        else:
            self.io.service_maintenance(self.iu.id, False)
            if not self._wait(f"{self.iu.id}'s maintenance gone", lambda: not self._in_maintenance(self.iu.id),
                              self.settle_s):
                self.outcome.steps.append(Step("release", at, self.now() - at, False, [], "maintenance still listed"))
                raise Stop("stopped", f"release: {self.iu.id} still listed in maintenance after {self.settle_s:g} s")
            self.set_maintenance = False
            did = [f"{self.iu.id} out of maintenance, listed after {self.now() - at:.1f} s"]
        self.outcome.steps.append(Step("release", at, self.now() - at, True, did))
        self.note("release", "; ".join(did))

    def _reboot(self) -> None:
        node = self.target.node.name
        self._breaker(tuple(iu.id for iu in self.target.node.ius))
        at = self.now()
        if self.reboot is None:
            done = RebootRun(False, [], "no inventory to run the reboot playbook with")
        else:
            self.note("reboot", f"playbooks/{PLAYBOOK} --limit {node}")
            done = self.reboot(node, f"{REASON_PREFIX}: {self.iu.id} {self.reason}")
        self.outcome.steps.append(Step("reboot", at, self.now() - at, done.ok, done.did, done.detail))
        self.note("reboot", "; ".join(done.did + ([] if done.ok else [f"FAILED: {done.detail}"])))
        if not done.ok:
            raise Stop("stopped", f"reboot could not be carried out: {done.detail}")

    def _repair(self) -> None:
        node = self.target.node
        ius = tuple(iu.id for iu in node.ius)
        self._breaker(ius)
        at, did = self.now(), []
        why = f"{REASON_PREFIX}: node marked for repair: {self.iu.id} {self.reason}"
        for iu in ius:
            if not self._in_maintenance(iu):
                self.io.service_maintenance(iu, True, why)
                did.append(f"{iu} in maintenance")
        record = {"marked_at": round(time.time(), 3), "by": REASON_PREFIX, "iu": self.iu.id, "reason": self.reason,
                  "steps": [f"{s.rung}: {'ok' if s.ok else 'failed'} {s.detail}".strip() for s in self.outcome.steps]}
        key = layout.repair_key(self.datacenter, node.name)
        if not self.io.kv_put(key, json.dumps(record)):
            raise Stop("stopped", f"repair: the record {key} was not written")
        did.append(f"record {key} written")
        listed = self._wait(f"every unit of {node.name} in maintenance",
                            lambda: all(self._in_maintenance(iu) for iu in ius), self.settle_s)
        self.outcome.steps.append(Step("repair", at, self.now() - at, listed, did,
                                       "" if listed else "not every unit listed in maintenance"))
        self.note("repair", "; ".join(did))
        if not listed:
            raise Stop("stopped", f"repair: not every unit of {node.name} was listed in maintenance within "
                                  f"{self.settle_s:g} s")

    def _left(self) -> list[str]:
        state, iu, node = self.outcome.state, self.iu.id, self.target.node.name
        board = [f"{b.id}: in maintenance for the board's reset; clear it with `clusterctl preflight --release`"
                 for b in self.board_drained]
        if state == "released":
            return [f"{iu}: serving, in rotation", *board]
        if state in ("planned", "refused"):
            return [f"{iu}: untouched"]
        if state == "repair":
            return [f"{node}: every unit in maintenance, marked for repair ({layout.repair_key(self.datacenter, node)})"]
        drained = any(s.rung == "drain" and s.ok for s in self.outcome.steps)
        stopped_unit = any(s.rung in ("gpu_reset", "fabric_reset") and not s.ok and any(d.startswith("systemctl stop") for d in s.did)
                           for s in self.outcome.steps)
        if not drained:
            return [f"{iu}: untouched (not drained)"]
        left = [f"{iu}: in maintenance (out of rotation)" + (f"; {self.unit} stopped" if stopped_unit else "")
                + "; clear it with `clusterctl preflight --release` once the unit is fixed"]
        left += board
        if any(s.rung == "reboot" for s in self.outcome.steps):
            try:
                why = node_maintenance(self.io.health_service()[1], tuple(i.id for i in self.target.node.ius))
            except Exception as exc:  # what it was left as is still worth saying without Consul's word on the node
                why = f"unknown: Consul did not answer ({exc})"
            if why is not None:
                left.append(f"{node}: in Consul node maintenance ({why}): the reboot playbook's drain; it clears it "
                            f"on a rerun that completes, or `consul maint -disable` on the node")
        return left
