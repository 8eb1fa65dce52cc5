"""One simulated run: a trace, a pool of IUs, edges that route with one policy, and the measurements."""

from __future__ import annotations

from dataclasses import dataclass, field

from consul_io import layout
from sim.vllm.engine import InferenceUnit, Seq
from sim.vllm.eventloop import EventLoop
from sim.vllm.roofline import IUModel

from .workload import TraceRequest


@dataclass(frozen=True)
class Record:
    """One measured request."""

    klass: str
    iu: int
    ttft: float
    queue_wait: float  # TTFT minus the request's own prefill time on an idle IU
    e2e: float


@dataclass
class RunResult:
    label: str
    records: list[Record]
    busy_fraction: list[float]  # share of the window each IU was executing steps (what NVML calls busy)
    compute_fraction: list[float]  # share of each IU's compute (at the model's MFU) the window used
    preemptions: int
    consul_writes: int | None
    window_s: float
    nodes: int
    extra: dict = field(default_factory=dict)


def own_prefill_time(model: IUModel, prompt: int) -> float:
    """Seconds the prompt alone takes on an idle IU, chunk by chunk (the part of TTFT no router can remove)."""
    budget = model.engine.max_num_batched_tokens
    total, done = 0.0, 0
    while done < prompt:
        chunk = min(budget, prompt - done)
        total += model.step_time(chunk, chunk * (done + chunk / 2.0), done + chunk)
        done += chunk
    return total


class Pool:
    """The IUs, the loop and the trace; policies plug in through `make_edge`."""

    def __init__(self, model: IUModel, ius: int, ius_per_node: int):
        self.model = model
        self.loop = EventLoop()
        self.units = [InferenceUnit(i, layout.iu_id(f"sim{i // ius_per_node:03d}", i % ius_per_node), model,
                                    self.loop.schedule, self._finished, on_first_token=self._first_token)
                      for i in range(ius)]
        self.ius_per_node = ius_per_node
        self.edges: list = []
        self.finished: list[Seq] = []
        self.true_wait: dict[int, float] | None = None  # rid -> the chosen IU's true estimated TTFT at pick

    def _first_token(self, seq: Seq, now: float) -> None:
        """The edge sees its stream's first byte (a LAN hop later, ignored)."""
        self.edges[seq.edge].first_token(seq.iu_index, seq.rid, now)

    def _finished(self, seq: Seq, now: float) -> None:
        self.finished.append(seq)
        self.edges[seq.edge].finished(seq.iu_index, now, seq.rid)
        if len(self.finished) == self._expected:
            self.loop.halt()

    def _arrive(self, request: TraceRequest, now: float) -> None:
        edge = request.edge(len(self.edges))
        iu = self.edges[edge].pick(request, now)
        if self.true_wait is not None:
            self.true_wait[request.rid] = self.units[iu].estimated_ttft(request.prompt, now, request.blocks)
        seq = Seq(request.rid, request.prompt, request.output, now, self._own[request.rid], edge,
                  request.blocks, request.reply_blocks)
        self.units[iu].submit(seq, now)

    def run(self, trace: list[TraceRequest], edges: list, own_prefill: list[float],
            window: tuple[float, float]) -> float:
        """Route and serve every request of the trace; returns the time the last one finished."""
        self.edges = edges
        self._expected = len(trace)
        for unit in self.units:
            unit.window = window
        self._own = own_prefill
        for request in trace:
            self.loop.schedule(request.arrival, self._arrive, request)
        self.loop.run()
        return self.loop.now


def measure(label: str, pool: Pool, trace: list[TraceRequest], warmup_s: float, end_s: float,
            consul_writes: int | None, extra: dict | None = None) -> RunResult:
    """Requests that arrived in [warmup_s, end_s) count; utilization is over the same window."""
    klass = {r.rid: r.klass for r in trace}
    records = [
        Record(klass[s.rid], s.iu_index, s.first_token - s.arrival, s.first_token - s.arrival - s.own_prefill,
               s.done_at - s.arrival)
        for s in pool.finished if warmup_s <= s.arrival < end_s
    ]
    window = end_s - warmup_s
    busy = [u.busy_in_window / window for u in pool.units]
    compute = [u.compute_in_window / window for u in pool.units]
    return RunResult(label, records, busy, compute, sum(u.counters.preemptions for u in pool.units), consul_writes,
                     window, len(pool.units) // pool.ius_per_node, extra or {})


def stable_seed(seed: int, label: str, index: int) -> int:
    """A seed derived from the run seed, a scenario label and an index (hash() of a str is salted per process)."""
    base = 0
    for c in label:
        base = (base * 131 + ord(c)) % (2**31)
    return seed * 1_000_003 + base * 97 + index
