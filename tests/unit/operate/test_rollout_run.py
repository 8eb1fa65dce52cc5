"""The rollout state machine: steps after their holds when gates held, abort at once on failure with the
evidence, the failure limit, the inconclusive rule, the last step, and operators' pause/resume/abort."""

from __future__ import annotations

import json

import pytest

from operate.rollout_gates import FAIL, INCONCLUSIVE, PASS, EdgeTotals, GateResult
from operate.rollout_plan import parse_plan
from operate.rollout_run import (
    Controller,
    StepProgress,
    abort_doc,
    on_evaluation,
    pause_doc,
    resume_doc,
    start_doc,
)

pytestmark = pytest.mark.unit


def plan(failure_limit=0, inconclusive="pause"):
    return parse_plan({"name": "r", "stable": "old", "canary": "new", "edges": ["e:1"], "failure_limit": failure_limit,
                       "inconclusive": inconclusive,
                       "steps": [{"weight": 5, "hold": "10s"}, {"weight": 50, "hold": "10s"},
                                 {"weight": 100, "hold": "10s"}],
                       "gates": [{"metric": "ttft_p99_ratio", "max": 1.5}, {"metric": "error_rate", "max": 0.01}]})


def results(ratio: str, errors: str = PASS) -> list[GateResult]:
    return [GateResult("ttft_p99_ratio", ratio, 2.0 if ratio == FAIL else 1.0, "ttft_p99_ratio <= 1.5", "p99 ..."),
            GateResult("error_rate", errors, 0.0, "error_rate <= 0.01", "0 failed")]


def progress() -> StepProgress:
    return StepProgress(EdgeTotals())


def test_a_step_passes_only_after_its_hold_with_its_gates_held():
    p = plan()
    doc, prog = start_doc(p, 0.0), progress()
    assert (doc.state, doc.weight) == ("progressing", 0.05)
    assert on_evaluation(doc, p, prog, results(PASS), 5.0) is doc  # hold not over
    doc = on_evaluation(doc, p, prog, results(PASS), 10.0)
    assert (doc.step, doc.weight, doc.step_started, doc.history[-1].event) == (1, 0.5, 10.0, "step")
    doc = on_evaluation(doc, p, progress(), results(PASS), 20.0)
    assert (doc.state, doc.effective_weight, doc.history[-1].event) == ("promoted", 1.0, "promote")


def test_a_failed_gate_aborts_at_once_with_reason_and_evidence():
    p = plan()
    doc = on_evaluation(start_doc(p, 0.0), p, progress(), results(FAIL), 1.0)
    assert (doc.state, doc.weight, doc.effective_weight) == ("aborted", 0.0, 0.0)
    assert doc.reason.startswith("gate failed: ttft_p99_ratio 2 (gate ttft_p99_ratio <= 1.5)")
    evidence = doc.history[-1].evidence
    assert evidence["weight"] == 0.05 and evidence["gates"][0]["verdict"] == FAIL


def test_the_failure_limit_tolerates_that_many_failed_evaluations():
    p, prog = plan(failure_limit=1), progress()
    doc = on_evaluation(start_doc(p, 0.0), p, prog, results(FAIL), 1.0)
    assert doc.state == "progressing" and doc.history[-1].event == "gate"
    assert on_evaluation(doc, p, prog, results(PASS, FAIL), 2.0).state == "aborted"


@pytest.mark.parametrize(("rule", "state", "step"), [("pause", "paused", 0), ("continue", "progressing", 1),
                                                      ("abort", "aborted", 0)])
def test_a_step_without_a_conclusive_evaluation_follows_the_inconclusive_rule(rule, state, step):
    p = plan(inconclusive=rule)
    doc = on_evaluation(start_doc(p, 0.0), p, progress(), results(INCONCLUSIVE), 10.0)
    assert (doc.state, doc.step) == (state, step)
    assert "inconclusive" in doc.reason or "inconclusive" in doc.history[-1].reason


def test_the_last_step_is_judged_without_the_comparisons_and_still_aborts():
    p = plan()
    doc = start_doc(p, 0.0)
    for now in (10.0, 20.0):
        doc = on_evaluation(doc, p, progress(), results(PASS), now)
    assert doc.state == "promoted"
    assert on_evaluation(doc, p, progress(), results(INCONCLUSIVE), 25.0).state == "promoted"
    assert on_evaluation(doc, p, progress(), results(INCONCLUSIVE, FAIL), 26.0).state == "aborted"


def test_paused_takes_no_step_but_a_failure_still_aborts_and_resume_restarts_the_hold():
    p = plan()
    doc = pause_doc(start_doc(p, 0.0), 1.0, "operator")
    assert on_evaluation(doc, p, progress(), results(PASS), 50.0) is doc
    assert on_evaluation(doc, p, progress(), results(FAIL), 51.0).state == "aborted"
    resumed = resume_doc(doc, 60.0)
    assert (resumed.state, resumed.step_started) == ("progressing", 60.0)
    assert on_evaluation(resumed, p, progress(), results(PASS), 65.0) is resumed


def test_each_start_draws_a_salt_for_its_sessions_and_every_step_keeps_it():
    """The edges place a session by a hash keyed with the document's salt: kept through the steps (a session
    stays where it is), new for the next rollout (other sessions meet its canary first)."""
    p = plan()
    doc = start_doc(p, 0.0)
    assert doc.session_salt != start_doc(p, 0.0).session_salt and len(doc.session_salt) == 32
    stepped = on_evaluation(doc, p, progress(), results(PASS), 10.0)
    assert stepped.step == 1 and stepped.session_salt == doc.session_salt
    assert abort_doc(pause_doc(stepped, 11.0, "operator"), 12.0, "operator").session_salt == doc.session_salt


def test_an_aborted_rollout_stays_aborted():
    p = plan()
    doc = abort_doc(start_doc(p, 0.0), 1.0, "operator")
    assert on_evaluation(doc, p, progress(), results(PASS), 100.0) is doc


class ConsulWithAgents:
    """The rollout document and the agents' bodies as the controller reads them; a canary GPU's XID arrives
    while the controller sleeps before the step's first evaluation."""

    def __init__(self, doc):
        self.doc, self.index, self.xids = doc.dumps(), 1, 0

    def kv_read(self, key):
        return self.index, self.doc

    def kv_cas_write(self, key, value, cas):
        self.doc, self.index = value, self.index + 1
        return self.index

    def health_service(self):
        return 1, [{"Service": {"ID": "n2-iu0", "Meta": {"revision": "new"}}, "Checks": []}]

    def kv_list(self, prefix):
        unit = {"score": 0.1, "status": "passing", "components": {"xid_events": self.xids, "xid_last": 79}}
        return 1, [{"Key": prefix + "n2", "Value": json.dumps({"node": "n2", "ts": 1.0, "ius": {"n2-iu0": unit}})}]


def test_an_xid_before_the_steps_first_evaluation_is_the_steps():
    p = parse_plan({"name": "r", "stable": "old", "canary": "new", "edges": ["e:1"], "interval": "1s",
                    "steps": [{"weight": 5, "hold": "10s"}, {"weight": 100, "hold": "1s"}],
                    "gates": [{"metric": "xid_events", "max": 0}]})
    consul, now = ConsulWithAgents(start_doc(p, 0.0)), [0.0]

    def sleep(seconds):
        consul.xids = 1  # the counter the step began with was 0
        now[0] += seconds

    controller = Controller(consul, p, "dc1", clock=lambda: now[0], sleep=sleep, scrape=lambda edges: EdgeTotals())
    doc = controller.run(start_doc(p, 0.0), 1)
    assert (doc.state, doc.reason) == ("aborted", "gate failed: xid_events 1 (gate xid_events <= 0): new XID "
                                                  "events: n2-iu0 1 (latest Xid 79) over 1 canary IUs")


def test_an_evaluations_time_counts_from_its_tick_so_a_late_wake_up_is_in_it():
    """The bound a decision is held to (one interval + the deciding evaluation's time) must include a wake-up
    that a loaded host delays: the decision waited for it as much as for the scrape."""
    p = parse_plan({"name": "r", "stable": "old", "canary": "new", "edges": ["e:1"], "interval": "1s",
                    "steps": [{"weight": 5, "hold": "10s"}, {"weight": 100, "hold": "1s"}],
                    "gates": [{"metric": "xid_events", "max": 0}]})
    consul, now = ConsulWithAgents(start_doc(p, 0.0)), [0.0]

    def sleep(seconds):
        consul.xids = 1
        now[0] += seconds + 0.2  # woken 0.2 s after the tick

    controller = Controller(consul, p, "dc1", clock=lambda: now[0], sleep=sleep, scrape=lambda edges: EdgeTotals())
    assert controller.run(start_doc(p, 0.0), 1).state == "aborted"
    assert controller.took_s == [pytest.approx(0.2)]
