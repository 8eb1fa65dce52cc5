"""Fixed preflight results for the snapshot tests: a broken NVLink pair, an IB link, a host's stderr with
rich markup in it, an unreachable host, a timed-out host, and healthy nodes."""

from __future__ import annotations

from preflight.checks.base import RunOptions
from preflight.result import CheckResult, Verdict
from preflight.runner import RunOutcome

CHECKS = ["gpu_topology", "gpu_health", "ib_ports", "ib_pairs", "nccl", "cstates", "numa_pinning", "time_sync"]


def r(rack, node, check, verdict, code, reason, iu=None, **evidence):
    return CheckResult(rack, node, f"{node}-{iu}" if iu else None, check, Verdict(verdict), reason,
                       {"code": code, **evidence})


def results() -> list[CheckResult]:
    out = []
    for node in ("r01n01", "r02n01"):  # healthy
        rack = node[:3]
        out += [r(rack, node, c, "PASS", c.upper() + "_OK", f"{c} ok") for c in CHECKS]
    out += [
        r("r01", "r01n02", "gpu_topology", "FAIL", "NVLINK_MISSING",
          "GPU2-GPU3 is NODE, not NVLink; suggested iu_layout: [[4, 5, 6, 7]] (GPUs [0, 1, 2, 3] unusable) (+1 more)",
          iu="iu0", problems=["GPU2-GPU3 is NODE, not NVLink; suggested iu_layout: [[4, 5, 6, 7]]",
                              "GPU2-GPU1 is SYS, not NVLink"]),
        r("r01", "r01n02", "gpu_health", "FAIL", "GPU_ROW_REMAP",
          "`nvidia-smi -q` exited 1: [/] oops [bold]not markup[/bold] (+4 more)",
          problems=["`nvidia-smi -q` exited 1: [/] oops", "GPU6 (r01n02-iu1): row remap pending (reset the GPU)",
                    "GPU7: 2 volatile uncorrectable ECC errors", "GPU5: retired pages 3", "GPU4: clocks throttled"]),
        r("r01", "r01n02", "ib_pairs", "FAIL", "IB_LATENCY",
          "ib_write_lat r01n02 mlx5_1 -> r01n01: 25.0 us > 2.5 us (+1 more)",
          found=[{"client": "r01n02", "problems": ["ib_write_lat mlx5_1: 25.0 us > 2.5 us",
                                                    "ib_write_bw mlx5_2: 189.52 Gb/s < 360"]}]),
        r("r01", "r01n02", "cstates", "WARN", "CSTATE_DEEP", "deep idle states enabled: C6 (290 us)"),
    ]
    out += [r("r01", "r01n02", c, "PASS", "OK", "ok") for c in ("ib_ports", "nccl", "numa_pinning", "time_sync")]
    for c in CHECKS:  # an unreachable host: one row, not eight
        out.append(r("r02", "r02n02", c, "UNREACHABLE", "HOST_UNREACHABLE",
                     "host unreachable: ssh: cannot connect to 127.0.0.1 port 1: connection refused"))
    out.append(r("r02", "r02n03", "gpu_topology", "ERROR", "TIMEOUT", "`nvidia-smi topo -m` timed out after 1s"))
    for c in CHECKS[1:]:
        out.append(r("r02", "r02n03", c, "ERROR", "NOT_RUN", "not run: `nvidia-smi topo -m` timed out earlier on this host"))
    return out


def outcome() -> RunOutcome:
    return RunOutcome(results(), started=1_800_000_000.0, finished=1_800_000_004.21, options=RunOptions(),
                      checks=CHECKS)
