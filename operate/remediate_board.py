"""The rungs of :mod:`operate.remediate` that reset GPUs, as steps of :class:`operate.remediate.Remediation`:

============  =========================================================================================
rung          what it does (the host steps: :class:`operate.gpu_reset.GpuReset`)
============  =========================================================================================
gpu_reset     the scope nvidia-smi(1) allows (the unit's GPUs where Fabric Manager runs, else the whole
              NVSwitch board); the GPUs reset, their fabric waited for, the units started
fabric_reset  a fatal NVSwitch SXID: always the whole board. Every unit of the node drained (the breaker
              judged for the node first), the units stopped, ``nvidia-fabricmanager.service`` restarted,
              every GPU reset, the fabric waited for (Completed + Success on every GPU), the units started
============  =========================================================================================

Both climb to the next rung (the reboot) when ``nvidia-smi`` refuses the reset or the fabric does not come back,
and stop the ladder when a command cannot be carried out. A board-sized scope puts the node's other units into
maintenance with their own reason and releases each once it is healthy again; one that is not stays out and is
named in what the unit was left as.

The fabric reset runs only where it is the first rung: when the unit's score body names a fatal SXID
(:func:`fatal_sxid`, the agent's verdict: eas_agent/kernel_verdict.py) or the operator names it (``--from
fabric_reset``). A unit that a restart or a GPU reset did not bring back climbs past it to the reboot: nothing
says its fabric is at fault, and restarting Fabric Manager stops NVLink for the whole board.
"""

from __future__ import annotations

import json
import re

from cluster.services import health_url
from operate.drill_faults import UNIT_TEMPLATE, HostStepError, run_on
from operate.gpu_reset import GpuReset, ResetScope, fabric_scope
from operate.remediate_outcome import Step, Stop

# The reason the agent gives every IU of the node for a fatal SXID (eas_agent/kernel_verdict.py, sxid_verdict);
# a unit test keeps the two in step.
FATAL_SXID = re.compile(r"NVSwitch (?P<switch>\S+) \(PCI:(?P<pci>[^)]*)\): fatal SXID (?P<sxid>\d+)")


def fatal_sxid(body_text: str | None, iu: str, now: float, max_age_s: float) -> str | None:
    """``fatal SXID N on NVSwitch S (PCI:...)`` when the unit's entry in its node's score body is critical for
    one and the body is younger than ``max_age_s`` (the agent holds the verdict for its ``xid_hold_s`` only)."""
    try:
        body = json.loads(body_text) if body_text else None
    except ValueError:
        return None
    unit = ((body.get("ius") if isinstance(body, dict) else None) or {}).get(iu)
    if not isinstance(unit, dict) or unit.get("status") != "critical":
        return None
    ts = body.get("ts")
    if isinstance(ts, (int, float)) and not isinstance(ts, bool) and now - ts > max_age_s:
        return None
    match = FATAL_SXID.search(str(unit.get("reason") or ""))
    if match is None:
        return None
    return f"fatal SXID {match['sxid']} on NVSwitch {match['switch']} (PCI:{match['pci']})"


class BoardSteps:
    """The reset rungs of :class:`operate.remediate.Remediation` (a mixin: it uses the ladder's fields)."""

    def _reset_job(self) -> GpuReset:
        return GpuReset(self.target.node, self.iu,
                        lambda argv, check: run_on(self.target, self.transport, argv, check=check),
                        fabric_wait_s=self.fabric_wait_s, clock=self.clock, sleep=self.sleep)

    def _gpu_reset(self) -> bool:
        """The GPU reset in the scope NVIDIA allows; True when the GPUs were reset, their fabric is back and the
        units started, False when nvidia-smi refused or the fabric did not come back (said, with why); a command
        that cannot run stops the ladder."""
        job = self._reset_job()
        return self._reset("gpu_reset", job, job.scope, restart_fabric_manager=False)

    def _fabric_reset(self) -> bool:
        """Fabric Manager restarted and the whole board reset (a fatal SXID); True, False and a stop as
        :meth:`_gpu_reset`."""
        job = self._reset_job()
        why = self.fabric_fault or "named by the operator (--from fabric_reset)"
        return self._reset("fabric_reset", job, lambda: fabric_scope(self.target.node, why),
                           restart_fabric_manager=True)

    def _reset(self, rung: str, job: GpuReset, scope_of, restart_fabric_manager: bool) -> bool:
        at = self.now()
        try:
            scope = scope_of()
            self.note(rung, f"scope: {scope.why}")
            if scope.ius != (self.iu,):
                self._drain_board(scope, rung)
            done = job.carry_out(scope, restart_fabric_manager=restart_fabric_manager)
        except HostStepError as exc:
            self.outcome.steps.append(Step(rung, at, self.now() - at, False, job.result.did, str(exc)))
            self.note(rung, f"FAILED: {exc}")
            raise Stop("stopped", f"{rung} could not be carried out: {exc}") from None
        if done.ok:
            detail, line = scope.why, "; ".join(done.did)
        elif done.fabric:
            detail = line = f"FABRIC NOT READY: {done.detail}: the next rung"
        else:
            detail = f"nvidia-smi refused the reset: {done.detail}; the next rung"
            line = f"REFUSED: {done.detail}: the next rung"
        self.outcome.steps.append(Step(rung, at, self.now() - at, done.ok, done.did, detail))
        self.note(rung, line)
        return done.ok

    def _drain_board(self, scope: ResetScope, rung: str) -> None:
        """Every other unit of the board out of rotation before the reset stops it (the breaker judged for the
        whole node first); their requests in flight left to finish, as the target's were."""
        self._breaker(tuple(iu.id for iu in scope.ius))
        at, did = self.now(), []
        others = [iu for iu in scope.ius if iu.id != self.iu.id]
        for iu in others:
            if not self._in_maintenance(iu.id):
                what = "GPU reset" if rung == "gpu_reset" else "fabric reset"
                self.io.service_maintenance(iu.id, True, f"{self.reason_prefix}: {what} of the board for {self.iu.id}")
                self.board_drained.append(iu)
                did.append(f"{iu.id} in maintenance")
        if not self._wait("the board in maintenance", lambda: all(self._in_maintenance(i.id) for i in others),
                          self.settle_s):
            raise Stop("stopped", f"{rung}: not every unit of {self.target.node.name} was listed in maintenance "
                                  f"within {self.settle_s:g} s")
        urls = [health_url(self.target.node.address, iu.port).removesuffix("/health") + "/metrics" for iu in others]
        if not self._wait("the board's requests in flight finished", lambda: all(self.running(u) == 0 for u in urls),
                          self.drain_s):
            did.append(f"requests still in flight after {self.drain_s:g} s: going ahead")
        self.outcome.steps.append(Step("drain board", at, self.now() - at, True, did))
        self.note("drain board", "; ".join(did) or "every unit already in maintenance")

    def _release_board(self) -> None:
        """The board's other units back in rotation once each is healthy; one that is not stays out, said."""
        for iu in list(self.board_drained):
            unit = UNIT_TEMPLATE.format(index=iu.index)
            url = health_url(self.target.node.address, iu.port)
            if not self._wait(f"{unit} active and {url} 200", lambda u=unit, h=url: self._active(u) and self.probe(h),
                              self.verify_s):
                self.note("release", f"{iu.id} not healthy within {self.verify_s:g} s: left in maintenance")
                continue
            self.io.service_maintenance(iu.id, False)
            self.board_drained.remove(iu)
            self.note("release", f"{iu.id} healthy: out of maintenance")
