"""Roofline service-time model of one inference unit (IU): a 70B-class dense model on 4× H100 SXM, TP=4.

Every constant below names its source. The model is deliberately simple (roofline: a step takes the longer
of its FLOPs at a realistic MFU and its HBM bytes at a realistic bandwidth efficiency, plus a fixed
per-step overhead) but it keeps the three effects routing depends on: prefill is compute-bound and linear
in prompt tokens, decode is bandwidth-bound so a step's cost is shared by the whole running batch, and the
KV cache is finite so a crowded IU stops admitting work and preempts.

Model: Llama-3-70B (meta-llama/Meta-Llama-3-70B config.json): 80 layers, hidden 8192, 64 query heads,
8 KV heads (GQA), head_dim 128, 70.6e9 parameters, BF16 weights (2 bytes/parameter).
  - weights: 70.6e9 × 2 B = 141 GB per IU (35.3 GB per GPU with TP=4).
  - KV bytes per token: 2 (K and V) × 80 layers × 8 KV heads × 128 × 2 B = 327,680 B (320 KiB).
  - FLOPs per token: 2 × parameters (one multiply-add per weight; Kaplan et al. 2020, "Scaling Laws",
    table 1) plus attention 4 × layers × hidden × context (QK^T and AV over the context).
Hardware: NVIDIA H100 SXM5 datasheet: 989 TFLOPS dense BF16 (1,979 is with sparsity), 3.35 TB/s HBM3,
80 GB per GPU (NVML reports 81,559 MiB = 85.5e9 B).
  - prefill MFU 0.45: large-GEMM prefill on H100 with TP=4 all-reduces measures 40-50% of dense peak.
  - decode HBM efficiency 0.75: achieved bandwidth of weight-streaming GEMV kernels is 70-80% of peak.
  - per-step overhead 3 ms: 160 NVLink all-reduces per step (2 per layer) at ~8 µs each ≈ 1.3 ms, plus
    scheduling, sampling and detokenization in the engine's CPU loop (~1.5 ms in vLLM V1).
vLLM settings (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults, GPUs with >= 70 GiB):
  max_num_batched_tokens 8192 (the chunked-prefill token budget per step, OpenAI server default);
  max_num_seqs 256 (the deployment setting; vLLM's default for smaller GPUs, and the
  deployment's rule of at most 256 sequences per IU); gpu_memory_utilization 0.9 (vLLM default); block_size 16 (vLLM default).
KV capacity: 4 × (85.5e9 × 0.9 − 35.3e9 weights − 5e9 activations, CUDA graphs and NCCL buffers)
  = 146.7e9 B → 447,700 tokens per IU.
Resulting speeds: prefill ≈ 12,600 tokens/s per IU (plus attention for long prompts); a decode step of
one sequence ≈ 17 ms (141 GB / 10 TB/s + 3 ms), each extra sequence adds its KV read (~75 µs at 2,300
tokens of context).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    """A dense decoder-only transformer, as the roofline sees it."""

    name: str = "Llama-3-70B (BF16)"
    parameters: float = 70.6e9
    layers: int = 80
    hidden: int = 8192
    kv_heads: int = 8
    head_dim: int = 128
    bytes_per_weight: int = 2
    bytes_per_kv_element: int = 2

    @property
    def weight_bytes(self) -> float:
        return self.parameters * self.bytes_per_weight

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_kv_element

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.parameters

    @property
    def attention_flops_per_token_context(self) -> float:
        """FLOPs per (token, context position): QK^T and AV, each a multiply-add over hidden."""
        return 4.0 * self.layers * self.hidden


@dataclass(frozen=True)
class GpuSpec:
    name: str = "H100 SXM5 80GB"
    bf16_dense_flops: float = 989e12
    hbm_bytes_per_s: float = 3.35e12
    memory_bytes: float = 85.5e9


@dataclass(frozen=True)
class EngineSpec:
    """vLLM engine settings and the efficiencies the roofline applies."""

    gpus: int = 4
    mfu: float = 0.45
    hbm_efficiency: float = 0.75
    step_overhead_s: float = 0.003
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    gpu_memory_utilization: float = 0.9
    activation_bytes_per_gpu: float = 5e9
    block_size: int = 16


@dataclass(frozen=True)
class IUModel:
    """Derived per-IU rates; every step time in the simulation comes from here."""

    model: ModelSpec = ModelSpec()
    gpu: GpuSpec = GpuSpec()
    engine: EngineSpec = EngineSpec()

    @property
    def flops_per_s(self) -> float:
        return self.engine.gpus * self.gpu.bf16_dense_flops * self.engine.mfu

    @property
    def bytes_per_s(self) -> float:
        return self.engine.gpus * self.gpu.hbm_bytes_per_s * self.engine.hbm_efficiency

    @property
    def kv_capacity_tokens(self) -> int:
        per_gpu = (
            self.gpu.memory_bytes * self.engine.gpu_memory_utilization
            - self.model.weight_bytes / self.engine.gpus
            - self.engine.activation_bytes_per_gpu
        )
        if per_gpu <= 0:
            raise ValueError("the model's weights do not fit in the IU's memory")
        return int(per_gpu * self.engine.gpus // self.model.kv_bytes_per_token)

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prefill rate ignoring attention (short prompts); long prompts are slower, see step_time."""
        return self.flops_per_s / self.model.flops_per_token

    def compute_time(self, tokens: int, attention_pairs: float) -> float:
        flops = tokens * self.model.flops_per_token + attention_pairs * self.model.attention_flops_per_token_context
        return flops / self.flops_per_s

    def step_time(self, tokens: int, attention_pairs: float, kv_read_tokens: float) -> float:
        """Seconds for one engine step.

        tokens: tokens computed in the step (decode tokens + prefill chunk tokens);
        attention_pairs: sum over those tokens of the context each attends to;
        kv_read_tokens: KV-cache tokens read from HBM (each decoding sequence reads its whole context).
        """
        hbm = self.model.weight_bytes + kv_read_tokens * self.model.kv_bytes_per_token
        return max(self.compute_time(tokens, attention_pairs), hbm / self.bytes_per_s) + self.engine.step_overhead_s

    def decode_step_linear(self, batch: int, context_tokens: float) -> tuple[float, float, float, float]:
        """Coefficients of a pure-decode step as context grows by `batch` tokens per step.

        Returns (compute0, compute1, memory0, memory1): step i (0-based) costs
        max(compute0 + compute1·i, memory0 + memory1·i) + overhead.
        """
        attn = self.model.attention_flops_per_token_context
        compute0 = (batch * self.model.flops_per_token + context_tokens * attn) / self.flops_per_s
        compute1 = batch * attn / self.flops_per_s
        kvb = self.model.kv_bytes_per_token
        memory0 = (self.model.weight_bytes + context_tokens * kvb) / self.bytes_per_s
        memory1 = batch * kvb / self.bytes_per_s
        return compute0, compute1, memory0, memory1


def _sum_linear(a: float, b: float, k: int) -> float:
    """sum_{i=0}^{k-1} (a + b·i)."""
    return k * a + b * k * (k - 1) / 2.0


def decode_group_time(coeffs: tuple[float, float, float, float], overhead: float, k: int) -> float:
    """Total seconds of k consecutive pure-decode steps (closed form; the max switches sides at most once)."""
    if k <= 0:
        return 0.0
    c0, c1, m0, m1 = coeffs
    # i* where compute overtakes memory (both linear); split the sum there.
    if c1 == m1:
        return k * overhead + (_sum_linear(c0, c1, k) if c0 >= m0 else _sum_linear(m0, m1, k))
    cross = (m0 - c0) / (c1 - m1)  # compute(i) >= memory(i) for i on one side of cross
    if c1 > m1:  # compute grows faster: memory-bound for i < cross
        split = min(k, max(0, math.ceil(cross)))
        first = _sum_linear(m0, m1, split)
        rest = _sum_linear(c0 + c1 * split, c1, k - split)
    else:  # memory grows faster: compute-bound for i < cross
        split = min(k, max(0, math.ceil(cross)))
        first = _sum_linear(c0, c1, split)
        rest = _sum_linear(m0 + m1 * split, m1, k - split)
    return k * overhead + first + rest


def decode_steps_within(coeffs: tuple[float, float, float, float], overhead: float, k_max: int,
                        elapsed: float) -> int:
    """Largest k <= k_max whose k steps finish within `elapsed` seconds (binary search on the closed form)."""
    lo, hi = 0, k_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if decode_group_time(coeffs, overhead, mid) <= elapsed + 1e-12:
            lo = mid
        else:
            hi = mid - 1
    return lo
