"""One inference unit running a vLLM-V1-like continuous-batching scheduler, in simulated time.

Each engine step serves every running sequence: decoding sequences get one token each, sequences still
in prefill get a chunk of the remaining step token budget (chunked prefill, max_num_batched_tokens), then
waiting requests are admitted first-come-first-served while the budget, max_num_seqs and free KV allow.
When a step cannot get KV slots for its running sequences the most recently admitted one is preempted
(recompute, vLLM V1's only mode: its KV is freed, it goes back to the head of the queue and later
re-prefills its prompt plus the tokens it had generated). KV is counted in tokens (block rounding of at
most 15 tokens per sequence is ignored).

Cost: a step that only decodes changes nothing but the context length, so consecutive pure-decode steps
run as one event whose duration has a closed form (see roofline.decode_group_time); the group ends at the
next sequence completion or KV exhaustion, and an arrival cuts it at the next step boundary. Mixed steps
(any prefill chunk) are one event each.

This is the one engine model of the tree: ``bench/route_sim.py`` runs it on its event loop for a pool of
IUs, and the simulated vLLM server (``sim.vllm.loadmodel.LoadModel``, behind ``/metrics`` and the OpenAI
API) advances one in wall-clock time. Step times come from ``sim.vllm.roofline`` (H100 x 4, TP=4,
Llama-3-70B, every constant cited there).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from sim.vllm.prefixcache import PrefixCache
from sim.vllm.roofline import IUModel, decode_group_time, decode_steps_within


class Seq:
    """A request as the engine tracks it."""

    __slots__ = ("rid", "prompt", "output", "target", "computed", "generated", "decode_start", "finish_step",
                 "decoding", "first_token", "done_at", "arrival", "own_prefill", "edge", "iu_index", "scheduled",
                 "blocks", "reply_blocks")

    def __init__(self, rid: int, prompt: int, output: int, arrival: float, own_prefill: float, edge: int,
                 blocks: tuple[int, ...] | None = (), reply_blocks: tuple[int, ...] = ()):
        self.rid = rid
        self.prompt = prompt
        self.output = output
        self.target = prompt  # tokens to (re)compute before the next token can be sampled
        self.computed = 0
        self.generated = 0  # valid while not decoding; while decoding see IU.generated_of
        self.decode_start = 0
        self.finish_step = 0
        self.decoding = False
        self.first_token: float | None = None
        self.done_at: float | None = None
        self.arrival = arrival
        self.own_prefill = own_prefill
        self.edge = edge
        self.iu_index = -1
        self.scheduled: float | None = None  # first admission from the waiting queue (vLLM's queue time ends)
        # the prompt's full blocks' chained hashes (sim.vllm.prefixcache); None: a prompt of unknown content
        self.blocks = blocks
        self.reply_blocks = reply_blocks  # the blocks prompt + reply complete (cached when the request ends)


@dataclass
class IUCounters:
    """What vLLM's /metrics would expose, cumulatively."""

    preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0
    finished_prompt_tokens: int = 0  # vllm:request_prompt_tokens histogram _sum (observed at completion)
    received_prompt_tokens: int = 0  # prompts handed to this IU (the network collector's ingress bytes)
    prefix_cache_queries: int = 0  # tokens looked up in the prefix cache at admission (vLLM V1)
    prefix_cache_hits: int = 0  # of those, tokens found cached (their prefill is skipped)
    prefix_cache_queries_unknown: int = 0  # of the queries, those of prompts of unknown content (blocks None)
    busy_s: float = 0.0


class InferenceUnit:
    def __init__(self, index: int, iu_id: str, model: IUModel, schedule, on_finish,
                 kv_capacity_tokens: int | None = None, on_first_token=None, on_steps=None,
                 prefix_caching: bool = True):
        """schedule(time, fn, arg) puts an event on the loop; on_finish(seq, now) tells the edges.
        kv_capacity_tokens: a smaller KV cache than the roofline's (tests of KV pressure); on_first_token(seq,
        now) and on_steps(tokens_per_step, steps) feed the simulated server's histograms (None: not called).
        prefix_caching: vLLM's --enable-prefix-caching (V1's default: on); block size from the model's engine."""
        self.index = index
        self.iu_id = iu_id
        self.model = model
        self.capacity = kv_capacity_tokens if kv_capacity_tokens is not None else model.kv_capacity_tokens
        if self.capacity <= 0:
            raise ValueError(f"KV capacity must be > 0 tokens, got {self.capacity}")
        self._on_first_token, self._on_steps = on_first_token, on_steps
        self.budget = model.engine.max_num_batched_tokens
        self.max_seqs = model.engine.max_num_seqs
        self.overhead = model.engine.step_overhead_s
        self._schedule = schedule
        self._on_finish = on_finish
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []  # admission order: the tail is preempted first
        self.prefilling: list[Seq] = []
        self.decode_count = 0
        self.decode_ctx = 0  # sum of contexts of decoding sequences
        self.kv_used = 0
        self.step_no = 0
        self.finish_heap: list[tuple[int, int, Seq]] = []
        self.counters = IUCounters()
        self.cache = PrefixCache(model.engine.block_size, prefix_caching)
        # the step or decode group in flight
        self.busy = False
        self.version = 0
        self.step_start = 0.0
        self.step_end = 0.0
        self.group_k = 0  # >0: a pure-decode group of this many steps is in flight
        self.group_coeffs = (0.0, 0.0, 0.0, 0.0)
        self.step_chunks: list[tuple[Seq, int]] = []
        self.waiting_tokens = 0  # sum of (target - computed) over waiting sequences
        self.window = (0.0, float("inf"))  # measurement window for busy_in_window
        self.busy_in_window = 0.0
        self.compute_in_window = 0.0  # FLOP-seconds at the model's MFU: how much of the compute was used
        self._step_compute = 0.0

    # ---- arrivals -------------------------------------------------------------------------------
    def submit(self, seq: Seq, now: float) -> None:
        seq.iu_index = self.index
        self.counters.received_prompt_tokens += seq.prompt
        self.waiting.append(seq)
        self.waiting_tokens += seq.target - seq.computed
        if not self.busy:
            self._plan(now)
        elif self.group_k:
            self._cut_group(now)

    def _cut_group(self, now: float) -> None:
        """End the decode group at the first step boundary after `now` so the arrival joins the next step."""
        done = decode_steps_within(self.group_coeffs, self.overhead, self.group_k, now - self.step_start)
        k = min(self.group_k, done + 1)
        if k == self.group_k:
            return
        self.group_k = k
        self.step_end = self.step_start + decode_group_time(self.group_coeffs, self.overhead, k)
        self.version += 1
        self._schedule(self.step_end, self._on_step_end, self.version)

    # ---- planning -------------------------------------------------------------------------------
    def generated_of(self, seq: Seq) -> int:
        return seq.generated + (self.step_no - seq.decode_start) if seq.decoding else seq.generated

    def _preempt_tail(self) -> None:
        seq = self.running.pop()
        if seq.decoding:
            generated = self.generated_of(seq)
            ctx = seq.prompt + generated
            self.decode_ctx -= ctx
            self.kv_used -= ctx
            self.decode_count -= 1
            seq.decoding = False
            seq.generated = generated
        else:
            self.prefilling.remove(seq)
            self.kv_used -= seq.computed
        seq.target = seq.prompt + seq.generated
        seq.computed = 0
        self.waiting.appendleft(seq)
        self.waiting_tokens += seq.target
        self.counters.preemptions += 1

    def _plan(self, now: float) -> None:
        self.busy = False
        self.group_k = 0
        if not self.running and not self.waiting:
            return
        # running sequences first: every decoding one needs a slot this step
        while self.decode_count and self.kv_used + self.decode_count > self.capacity:
            self._preempt_tail()
        budget = self.budget - self.decode_count
        chunks: list[tuple[Seq, int]] = []
        free = self.capacity - self.kv_used - self.decode_count
        for seq in self.prefilling:
            if budget <= 0:
                break
            chunk = min(seq.target - seq.computed, budget, free)
            if chunk <= 0:
                break
            chunks.append((seq, chunk))
            budget -= chunk
            free -= chunk
        cache = self.cache
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            seq = self.waiting[0]
            cached = cache.peek(seq.blocks) * cache.block_size if seq.blocks and not seq.computed else 0
            cached = min(cached, seq.target - 1)
            chunk = min(seq.target - seq.computed - cached, budget)
            if chunk + cached > free:
                break  # vLLM stops admitting when the head of the queue cannot get its blocks
            self.waiting.popleft()
            if seq.scheduled is None:
                seq.scheduled = now
            self.waiting_tokens -= seq.target - seq.computed
            self.counters.prefix_cache_queries += seq.target
            if seq.blocks is None:
                self.counters.prefix_cache_queries_unknown += seq.target
            if cached:  # the cached blocks are the sequence's: their prefill is skipped
                cached = cache.hit_tokens(seq.blocks, seq.target)
                self.counters.prefix_cache_hits += cached
                seq.computed = cached
                self.kv_used += cached
                free -= cached
            self.running.append(seq)
            self.prefilling.append(seq)
            chunks.append((seq, chunk))
            budget -= chunk
            free -= chunk
        if not chunks and not self.decode_count:
            if self.prefilling:  # prefills stuck on KV with nothing decoding: free the tail and retry
                self._preempt_tail()
                self._plan(now)
            return
        self.busy = True
        self.step_start = now
        self.version += 1
        if chunks:
            self.step_chunks = chunks
            tokens = self.decode_count
            pairs = float(self.decode_ctx)
            kv_read = float(self.decode_ctx)
            for seq, chunk in chunks:
                tokens += chunk
                pairs += chunk * (seq.computed + chunk / 2.0)
                kv_read += seq.computed + chunk
            self.step_end = now + self.model.step_time(tokens, pairs, kv_read)
            self._step_compute = self.model.compute_time(tokens, pairs)
        else:
            self.step_chunks = []
            to_finish = self._next_finish_step() - self.step_no
            kv_steps = (self.capacity - self.kv_used) // self.decode_count
            k = max(1, min(to_finish, kv_steps))
            self.group_k = k
            self.group_coeffs = self.model.decode_step_linear(self.decode_count, self.decode_ctx)
            self.step_end = now + decode_group_time(self.group_coeffs, self.overhead, k)
            self._step_compute = 0.0  # set when the group ends (an arrival may cut it short)
        self._schedule(self.step_end, self._on_step_end, self.version)

    def _next_finish_step(self) -> int:
        heap = self.finish_heap
        while heap and (not heap[0][2].decoding or heap[0][2].finish_step != heap[0][0]):
            heapq.heappop(heap)  # stale entry of a preempted or re-admitted sequence
        return heap[0][0]

    # ---- completing steps -----------------------------------------------------------------------
    def _on_step_end(self, version: int, now: float) -> None:
        if version != self.version:
            return
        steps = self.group_k if self.group_k else 1
        if self.group_k:
            c0, c1 = self.group_coeffs[0], self.group_coeffs[1]
            self._step_compute = steps * c0 + c1 * steps * (steps - 1) / 2.0
        self.counters.busy_s += self.step_end - self.step_start
        overlap = min(self.step_end, self.window[1]) - max(self.step_start, self.window[0])
        if overlap > 0:
            self.busy_in_window += overlap
            self.compute_in_window += self._step_compute * overlap / (self.step_end - self.step_start)
        self.step_no += steps
        grown = self.decode_count * steps
        if self._on_steps is not None:
            if self.step_chunks:
                self._on_steps(grown + sum(chunk for _, chunk in self.step_chunks), 1)
            else:
                self._on_steps(self.decode_count, steps)
        self.decode_ctx += grown
        self.kv_used += grown
        self.counters.generation_tokens += grown
        heap = self.finish_heap
        while heap and heap[0][0] <= self.step_no:
            _, _, seq = heapq.heappop(heap)
            if seq.decoding and seq.finish_step <= self.step_no:
                self._finish(seq, now)
        for seq, chunk in self.step_chunks:
            seq.computed += chunk
            self.kv_used += chunk
            if seq.computed < seq.target:
                continue
            self.prefilling.remove(seq)
            seq.generated += 1
            self.counters.generation_tokens += 1
            self.kv_used += 1
            if seq.blocks:
                self.cache.store(seq.blocks)
            if seq.first_token is None:
                seq.first_token = now
                self.counters.prompt_tokens += seq.prompt
                if self._on_first_token is not None:
                    self._on_first_token(seq, now)
            if seq.generated >= seq.output:
                self.running.remove(seq)
                self.kv_used -= seq.prompt + seq.generated
                self._done(seq, now)
                continue
            seq.decoding = True
            seq.decode_start = self.step_no
            seq.finish_step = self.step_no + seq.output - seq.generated
            self.decode_count += 1
            self.decode_ctx += seq.prompt + seq.generated
            heapq.heappush(heap, (seq.finish_step, seq.rid, seq))
        self.step_chunks = []
        if self.cache.blocks:
            self.cache.fit(self.capacity - self.kv_used)
        self._plan(now)

    def _finish(self, seq: Seq, now: float) -> None:
        ctx = seq.prompt + seq.output
        seq.decoding = False
        seq.generated = seq.output
        self.decode_count -= 1
        self.decode_ctx -= ctx
        self.kv_used -= ctx
        self.running.remove(seq)
        self._done(seq, now)

    def _done(self, seq: Seq, now: float) -> None:
        if seq.reply_blocks:
            self.cache.store(seq.reply_blocks)
        seq.done_at = now
        self.counters.requests_finished += 1
        self.counters.finished_prompt_tokens += seq.prompt
        self._on_finish(seq, now)

    # ---- observation ----------------------------------------------------------------------------
    def decode_progress(self, now: float) -> int:
        """Tokens the decode group in flight has generated by `now` (a scrape sees them mid-group)."""
        if self.busy and self.group_k and now > self.step_start:
            done = decode_steps_within(self.group_coeffs, self.overhead, self.group_k, now - self.step_start)
            return done * self.decode_count
        return 0

    def tokens_of(self, seq: Seq, now: float) -> int:
        """Tokens `seq` has generated by `now`, counting the steps of a decode group in flight."""
        generated = self.generated_of(seq)
        if seq.decoding and self.busy and self.group_k and now > self.step_start:
            done = decode_steps_within(self.group_coeffs, self.overhead, self.group_k, now - self.step_start)
            generated = min(seq.output, generated + done)
        return generated

    def busy_seconds(self, now: float) -> float:
        extra = min(now, self.step_end) - self.step_start if self.busy and now > self.step_start else 0.0
        return self.counters.busy_s + extra

    def estimated_ttft(self, prompt: int, now: float, blocks: tuple[int, ...] = ()) -> float:
        """The oracle's view: seconds until a new request of `prompt` tokens would get its first token here,
        from the exact instantaneous state (queue, chunks in flight, KV, every sequence's remaining length);
        ``blocks``: its block hashes, whose cached leading run costs no prefill."""
        model = self.model
        if blocks:
            prompt -= min(self.cache.peek(blocks) * self.cache.block_size, prompt - 1)
        remaining_step = max(0.0, self.step_end - now) if self.busy else 0.0
        if self.busy and self.group_k:  # a decode group is cut at the next step boundary for an arrival
            done = decode_steps_within(self.group_coeffs, self.overhead, self.group_k, now - self.step_start)
            boundary = self.step_start + decode_group_time(self.group_coeffs, self.overhead, done + 1)
            remaining_step = max(0.0, boundary - now)
        backlog = self.waiting_tokens + prompt
        for seq in self.prefilling:
            backlog += seq.target - seq.computed
        per_step = max(1, self.budget - self.decode_count)
        if backlog <= per_step:
            prefill = model.step_time(self.decode_count + backlog, self.decode_ctx + backlog * backlog / 2.0,
                                      self.decode_ctx)
        else:
            full = model.step_time(self.budget, self.decode_ctx + per_step * per_step / 2.0, self.decode_ctx)
            prefill = full * backlog / per_step
        wait = remaining_step + prefill
        # blocked on KV or sequence slots: wait for the running sequences that finish first
        kv_deficit = self.kv_used + self.waiting_tokens + prompt - self.capacity
        seat_deficit = len(self.running) + len(self.waiting) + 1 - self.max_seqs
        if (kv_deficit > 0 or seat_deficit > 0) and self.decode_count:
            finishing = sorted(s.finish_step for s in self.running if s.decoding)
            freed = 0
            needed_step = finishing[-1]
            for i, step in enumerate(finishing):
                freed += 1
                if freed >= seat_deficit and (kv_deficit <= 0 or freed * (self.decode_ctx / self.decode_count)
                                              >= kv_deficit):
                    needed_step = step
                    break
                if i == len(finishing) - 1:
                    needed_step = step
            coeffs = model.decode_step_linear(self.decode_count, self.decode_ctx)
            wait += decode_group_time(coeffs, self.overhead, max(0, needed_step - self.step_no))
        return wait
