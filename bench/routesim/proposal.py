"""What-if, not the agent's code: the `drain` score plus the prompt tokens an IU admitted but has not prefilled.

Why (the benchmark's "why" lines): vLLM V1 counts a request whose prompt is being prefilled in chunks as
running, not waiting, and adds its prompt to prompt_tokens_total only at its first token, so `drain` sees an
IU chewing through a 12,842-token prompt (about 1.1 s) as nearly idle. V1 does expose the missing number:
prefix_cache_queries_total grows by a request's tokens when the scheduler admits it, so
queries - prompt_tokens is the prompt backlog already admitted. This wrapper adds backlog / measured prefill
rate to the real Scorer's result; it re-zeroes the difference whenever the IU is idle, because vLLM also
counts a lookup that fails for lack of KV and the recompute of a preempted request, which never reach
prompt_tokens_total. It exists to measure the proposal before it is made in eas_agent/score.py.
"""

from __future__ import annotations

from eas_agent.score import IUInputs, Scorer, ScoreResult


class BacklogAwareScorer:
    def __init__(self, inner: Scorer):
        self.inner = inner
        self.offset = 0.0

    def score(self, inputs: IUInputs, now: float) -> ScoreResult:
        result = self.inner.score(inputs, now)
        m = inputs.vllm.metrics
        if result.score is None or m is None or m.prefix_cache_queries_total is None \
                or m.prompt_tokens_total is None or not result.components.get("prefill_tps"):
            return result
        difference = m.prefix_cache_queries_total - m.prompt_tokens_total
        if not m.num_requests_running and not m.num_requests_waiting:
            self.offset = difference
        backlog = max(0.0, difference - self.offset)
        prefill_s = backlog / float(result.components["prefill_tps"])
        components = {**result.components, "admitted_prefill_tokens": round(backlog), "prefill_s": round(prefill_s, 4)}
        return ScoreResult(round(result.score + prefill_s, 4), result.status, result.reason, components)
