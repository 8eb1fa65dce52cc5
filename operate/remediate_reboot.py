"""The reboot rung of :mod:`operate.remediate`: the unit's whole node rebooted by the provisioning playbooks'
reboot chain, because some faults come back only with the node (NVIDIA's Xid catalog: RESTART_BM, "restart
bare metal", for XID 79, a GPU fallen off the bus, which ``nvidia-smi --gpu-reset`` cannot reach).

==========================  ======================================================================================
step                        what and its bound
==========================  ======================================================================================
breaker                     judged for every unit of the node (the reboot takes them all out), before anything
``playbooks/node-reboot.yml`` ``--limit <node>``, through provision's runner (events in ``.state/runs/<time>``):
                            ``tasks/node_drain.yml`` (Consul node maintenance with the node's agent token, the
                            edges' view within ``clusterctl_drain_view_timeout_s`` 60 s, requests in flight within
                            ``clusterctl_drain_inflight_timeout_s`` 120 s), ``ansible.builtin.reboot`` (back within
                            ``clusterctl_reboot_timeout_s`` 1800 s), the loaded NVIDIA driver the one it ran before, then
                            ``tasks/node_release.yml`` (the units that served before pass again within
                            ``clusterctl_release_timeout_s`` 900 s, then the node maintenance off)
verify                      the ladder's own: the unit ``active`` and its ``/health`` 200 within ``--verify-s``
==========================  ======================================================================================

The rung counts as carried out only when the playbook succeeded and its "Reboot the host" task rebooted the
node; anything else (the drain not confirmed, the host not back in time, a Consul server, a host on hold)
stops the ladder with what the playbook said, and the node stays in whatever maintenance the drain left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

PLAYBOOK = "node-reboot.yml"
NODE_MAINTENANCE_CHECK = "_node_maintenance"  # Consul's check of a node in maintenance (agent/maintenance)
RUNS_DIR = Path(".state") / "runs"  # where clusterctl provision keeps its runs


@dataclass
class RebootRun:
    """What one run of the reboot playbook did: ``ok`` when it succeeded and rebooted the node."""

    ok: bool
    did: list[str] = field(default_factory=list)
    detail: str = ""


@dataclass
class PlaybookReboot:
    """Reboots one node with ``playbooks/node-reboot.yml`` through :func:`provision.run.run_playbook` (the
    runner ``clusterctl provision`` uses): the inventory validated first, events recorded in the run dir."""

    inventory: str
    vault_secrets: object = None  # cluster.ansible.vault secrets (``--vault-password-file``)
    vault_password_file: Path | None = None
    runs_dir: Path = RUNS_DIR
    log: Callable[[str], None] = lambda line: None

    def __call__(self, node: str, reason: str) -> RebootRun:
        from provision import run
        from provision.plan import make_plan

        plan = make_plan(self.inventory, PLAYBOOK, limit=node, batch_sizes=(1,), vault_secrets=self.vault_secrets)
        run_dir = self.runs_dir / datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        if problem := run.run_dir_problem(run_dir, plan.inventory):
            return RebootRun(False, [], problem)

        def on_event(rollout) -> None:
            for notice in rollout.notices:
                self.log(f"reboot: {notice}")

        result = run.run_playbook(plan, run_dir, vault_password_file=self.vault_password_file, allow_reboot=True,
                                  extravars={"clusterctl_reboot_reason": reason}, on_event=on_event)
        rollout = result.rollout
        did = [f"ansible-playbook {PLAYBOOK} --limit {node} (events: {run_dir / 'events.jsonl'})"]
        if node in rollout.rebooted:
            did.append(f"{node} rebooted")
        ok = result.succeeded() and node in rollout.rebooted
        detail = "" if ok else "; ".join(rollout.messages) or rollout.summary()
        return RebootRun(ok, did, detail)


def node_maintenance(entries: list[dict], ius: tuple[str, ...]) -> str | None:
    """The reason of the node maintenance Consul lists on these units' entries (None: none)."""
    for entry in entries:
        if (entry.get("Service") or {}).get("ID") not in ius:
            continue
        for check in entry.get("Checks") or []:
            if check.get("CheckID") == NODE_MAINTENANCE_CHECK:
                return str(check.get("Notes") or "no reason given")
    return None
