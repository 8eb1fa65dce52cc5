"""A rollout's state machine and the controller that drives it; the state lives in Consul, not here.

States (the document's, eas_wire/rollout.py): ``progressing`` -> (each step's hold over, its gates passed) the
next step's weight ... -> ``promoted`` (the last step, 100%: the canary takes all; its hold is watched with the
gates that still apply, and a failure there still aborts). ``paused``: weight kept, no step taken (an operator,
or the inconclusive rule); ``resume`` restarts the step's hold. ``aborted``: weight 0 at once, the reason and
the evidence (every gate's value and basis) in the document's history.

Per evaluation (every ``interval``, over everything since the step began): a failed gate counts a failure; past
``failure_limit`` failures in the step the rollout is aborted. A step whose hold is over moves on when some
evaluation in it passed every gate and the last did not fail; when none was conclusive the ``inconclusive``
rule decides (pause, continue, abort).

Every write is a check-and-set on the document's index, so two controllers, or a controller and an operator's
``pause`` / ``abort``, never overwrite each other: a stale write is dropped and the document read again. A
restarted controller (``clusterctl rollout start`` with the same file) resumes the step in the document, its
hold counted from the step's start.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field, replace

from consul_io import layout
from consul_io.client import ConsulIO
from eas_wire.rollout import Event, RolloutDoc, RolloutError, loads
from operate.rollout_gates import (
    FAIL,
    PASS,
    ConsulSamples,
    EdgeTotals,
    GateResult,
    evaluate,
    scrape_edges,
    units_by_revision,
    verdict_of,
)
from operate.rollout_plan import RolloutPlan, RolloutPlanError, document_error

ACTIVE = ("progressing", "paused")
# gates that compare the canary with stable: without stable traffic (the last step) they cannot be judged
COMPARATIVE = ("ttft_p99_ratio", "error_rate_delta", "ttft_jitter_delta")


@dataclass
class StepProgress:
    """What the controller saw in the current step (kept in memory; a restarted controller starts it anew)."""

    base: EdgeTotals
    consul: ConsulSamples = field(default_factory=ConsulSamples)
    failures: int = 0
    passed: bool = False
    last: str | None = None  # the last evaluation's verdict


def _event(doc: RolloutDoc, now: float, event: str, weight: float, reason: str = "", evidence=None) -> tuple:
    return (*doc.history, Event(now, event, weight, reason, evidence or {}))


def start_doc(plan: RolloutPlan, now: float) -> RolloutDoc:
    """The first step's document; its session salt is new, so which sessions meet the canary first is drawn
    again for every rollout (eas_wire/rollout.py ``session_point``)."""
    first = plan.steps[0].weight
    doc = RolloutDoc(plan.name, plan.stable, plan.canary, first, "progressing", 0, now, "", (), now,
                     tuple((s.weight, s.hold_s) for s in plan.steps), secrets.token_hex(16))
    return replace(doc, history=_event(doc, now, "start", first, f"step 1 of {len(plan.steps)}"))


def abort_doc(doc: RolloutDoc, now: float, reason: str, evidence: dict | None = None) -> RolloutDoc:
    return replace(doc, weight=0.0, state="aborted", updated=now, reason=reason,
                   history=_event(doc, now, "abort", 0.0, reason, evidence))


def pause_doc(doc: RolloutDoc, now: float, reason: str) -> RolloutDoc:
    return replace(doc, state="paused", updated=now, reason=reason,
                   history=_event(doc, now, "pause", doc.weight, reason))


def resume_doc(doc: RolloutDoc, now: float) -> RolloutDoc:
    return replace(doc, state="progressing", updated=now, step_started=now, reason="",
                   history=_event(doc, now, "resume", doc.weight, "the step's hold starts again"))


def _advance(doc: RolloutDoc, plan: RolloutPlan, now: float, why: str) -> RolloutDoc:
    step = doc.step + 1
    weight = plan.steps[step].weight
    last = step == len(plan.steps) - 1
    doc = replace(doc, step=step, weight=weight, state="promoted" if last else "progressing", updated=now,
                  step_started=now, reason="")
    return replace(doc, history=_event(doc, now, "promote" if last else "step", weight,
                                       f"step {step + 1} of {len(plan.steps)}: {why}"))


def on_evaluation(doc: RolloutDoc, plan: RolloutPlan, progress: StepProgress, results: list[GateResult],
                  now: float) -> RolloutDoc:
    """The document after one evaluation (the same object when nothing changes)."""
    if doc.state not in (*ACTIVE, "promoted"):
        return doc
    if doc.state == "promoted":  # the last step: only what can still be judged without stable traffic
        results = [r for r in results if r.metric not in COMPARATIVE]
    verdict = verdict_of(results)
    progress.last = verdict
    evidence = {"step": doc.step, "weight": doc.weight, "gates": [r.to_json() for r in results]}
    if verdict == FAIL:
        progress.failures += 1
        failed = "; ".join(f"{r.metric} {r.value:g} (gate {r.gate}): {r.detail}" for r in results
                           if r.verdict == FAIL)
        if progress.failures > plan.failure_limit:
            return abort_doc(doc, now, f"gate failed: {failed}", evidence)
        return replace(doc, updated=now, history=_event(doc, now, "gate", doc.weight,
                                                        f"failure {progress.failures} of {plan.failure_limit} "
                                                        f"allowed: {failed}", evidence))
    if verdict == PASS:
        progress.passed = True
    if doc.state != "progressing" or now - doc.step_started < plan.steps[doc.step].hold_s:
        return doc
    if progress.passed:
        return _advance(doc, plan, now, "gates held")
    reason = f"inconclusive: no evaluation in step {doc.step + 1} had every gate's data ({plan.inconclusive})"
    if plan.inconclusive == "continue":
        return _advance(doc, plan, now, reason)
    if plan.inconclusive == "abort":
        return abort_doc(doc, now, reason, evidence)
    return pause_doc(doc, now, reason)


# -- Consul -------------------------------------------------------------------------------------------------
def read_doc(io: ConsulIO, datacenter: str) -> tuple[int, RolloutDoc | None]:
    """(index for check-and-set, document or None). RolloutPlanError for a document that does not parse."""
    key = layout.rollout_key(datacenter)
    index, value = io.kv_read(key)
    if not value:
        return index, None
    try:
        return index, loads(value)
    except RolloutError as exc:
        raise document_error(exc, key) from None


def write_doc(io: ConsulIO, datacenter: str, doc: RolloutDoc, index: int) -> int | None:
    """Check-and-set ``doc``; the new index, or None when another writer came first."""
    return io.kv_cas_write(layout.rollout_key(datacenter), doc.dumps(), index)


def operate(io: ConsulIO, datacenter: str, change, attempts: int = 5) -> RolloutDoc:
    """Apply ``change(doc) -> doc`` to the current document by check-and-set (retried on a concurrent write)."""
    for _ in range(attempts):
        index, doc = read_doc(io, datacenter)
        if doc is None:
            raise RolloutPlanError(f"{layout.rollout_key(datacenter)}: no rollout in Consul (start one first)")
        new = change(doc)
        if new is doc or write_doc(io, datacenter, new, index) is not None:
            return new
    raise RolloutPlanError(f"{layout.rollout_key(datacenter)}: written by someone else {attempts} times in a row")


class Controller:
    """Drives one rollout until it is promoted (and its last hold is over) or aborted. ``on_event(doc, text)``
    is told each change; ``sleep`` and ``clock`` are parameters so tests can run it in their own time."""

    def __init__(self, io: ConsulIO, plan: RolloutPlan, datacenter: str = layout.DEFAULT_DATACENTER,
                 on_event=lambda doc, text: None, clock=time.time, sleep=time.sleep, scrape=scrape_edges):
        self.io, self.plan, self.dc = io, plan, datacenter
        self.on_event, self.clock, self.sleep, self.scrape = on_event, clock, sleep, scrape
        self.evaluations: list[tuple[float, float, list[GateResult]]] = []  # (time, weight, results)
        # each evaluation's time from its tick: a late wake-up, the document's read, sampling, scraping, judging,
        # writing (what a decision waits for beyond the cadence)
        self.took_s: list[float] = []

    def _progress(self) -> StepProgress:
        progress = StepProgress(self.scrape(self.plan.edges))
        progress.consul.sample(self.io, self.plan, self.dc)  # the agents' XID counters as the step begins
        return progress

    def run(self, doc: RolloutDoc, index: int) -> RolloutDoc:
        progress, step = self._progress(), (doc.step, doc.step_started)
        tick = self.clock()
        while True:
            if doc.state == "aborted" or (doc.state == "promoted" and
                                          self.clock() - doc.step_started >= self.plan.steps[doc.step].hold_s):
                return doc
            tick += self.plan.interval_s  # evaluations keep their cadence however long one takes
            self.sleep(max(0.0, tick - self.clock()))
            began = min(tick, self.clock())
            index, current = read_doc(self.io, self.dc)
            if current is None:
                raise RolloutPlanError(f"{layout.rollout_key(self.dc)}: the rollout document was removed")
            if current != doc:  # an operator's pause, resume or abort (or another controller's step)
                self.on_event(current, f"document changed in Consul: {current.state}")
                doc = current
                if (doc.step, doc.step_started) != step:
                    progress, step = self._progress(), (doc.step, doc.step_started)
                continue
            progress.consul.sample(self.io, self.plan, self.dc)
            results = evaluate(self.plan, self.scrape(self.plan.edges).since(progress.base), progress.consul)
            now = self.clock()
            self.evaluations.append((now, doc.effective_weight, results))
            new = on_evaluation(doc, self.plan, progress, results, now)
            if new is doc:
                self.took_s.append(self.clock() - began)
                continue
            written = write_doc(self.io, self.dc, new, index)
            self.took_s.append(self.clock() - began)
            if written is None:  # someone else wrote: read it at the next turn, decide again
                continue
            self.on_event(new, new.history[-1].reason if new.history else new.state)
            doc, index = new, written
            if (doc.step, doc.step_started) != step:
                progress, step = self._progress(), (doc.step, doc.step_started)


def begin(io: ConsulIO, plan: RolloutPlan, datacenter: str, now: float) -> tuple[int, RolloutDoc, bool]:
    """Write the rollout's first step, or take up the one in Consul (same name and revisions, not finished):
    (index, document, resumed). RolloutPlanError when another rollout is active or a revision has no IU."""
    index, doc = read_doc(io, datacenter)
    if doc is not None and doc.state in ACTIVE:
        if (doc.name, doc.stable, doc.canary) != (plan.name, plan.stable, plan.canary):
            raise RolloutPlanError(f"{plan.source}: rollout {doc.name!r} ({doc.state}) is in Consul; abort it first")
        return index, doc, True
    units = units_by_revision(io.health_service()[1])
    for role, revision in (("stable", plan.stable), ("canary", plan.canary)):
        if not units.get(revision):
            known = ", ".join(f"{r} ({n})" for r, n in sorted(units.items())) or "none"
            raise RolloutPlanError(f"{plan.source}: {role}: no IU is registered with revision {revision!r} "
                                   f"(registered: {known})")
    new = start_doc(plan, now)
    written = write_doc(io, datacenter, new, index)
    if written is None:
        raise RolloutPlanError(f"{layout.rollout_key(datacenter)}: written by someone else while starting")
    return written, new, False
