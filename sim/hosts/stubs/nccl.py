"""``all_reduce_perf`` from nccl-tests (single process, ``-g`` GPUs).

Layout of nccl-tests 2.13 (src/common.cu): the version line (NCCL_VERSION_CODE of the headers and of the
loaded library, which is how a drifted NCCL shows), the ``# nThread ...`` banner, ``# Using devices`` with one
``#  Rank`` line per GPU, the two-line column header, one row per size printed as
``%12li  %12li  %8s  %6s  %6i`` followed by ``  %7s  %6.2f  %6.2f  %5g`` for out-of-place and in-place
(time as %7.2f/%7.1f/%7.0f by magnitude), then ``# Out of bounds values`` and ``# Avg bus bandwidth``.

Bus bandwidth follows a latency + bandwidth model: time = 25 us + bytes * 2(n-1)/n / peak, where peak is
the host's ``nccl_busbw_gbs`` for n GPUs (~480 GB/s for 8x H100, ~365 GB/s for 4), so a 1-8 GB message
lands within 1% of the peak as on real HGX boards and small messages are latency bound. A GPU pair
without NVLink (``nvlink_down``) forces NCCL onto PCIe for the whole ring (peak 40 GB/s).
"""

from __future__ import annotations

import os
import socket

from sim.hosts.hardware import Hardware
from sim.hosts.stubs.main import StubUsageError

BASE_LATENCY_US = 25.0
PCIE_RING_BUSBW = 40.0
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def _size(text: str) -> int:
    text = text.strip().upper()
    unit = text[-1] if text and text[-1] in "KMG" else ""
    return int(float(text[: len(text) - len(unit)]) * _UNITS[unit])


def _time_str(us: float) -> str:
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def _peak(hw: Hardware, gpus: list[int]) -> float:
    n = len(gpus)
    if n < 2:
        return 0.0
    known = sorted(k for k in hw.nccl_busbw_gbs if k <= n) or [min(hw.nccl_busbw_gbs)]
    peak = hw.nccl_busbw_gbs[known[-1]]
    if any(hw.nvlinks(a, b) == 0 for a in gpus for b in gpus if a < b):
        peak = min(peak, PCIE_RING_BUSBW)
    return peak


def all_reduce_perf(hw: Hardware, args: list[str]) -> int:
    opts = {"-b": "8", "-e": "128M", "-f": "2", "-g": "1", "-c": "1", "-n": "20", "-w": "5"}
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        key, _, inline = arg.partition("=")
        aliases = {"--minbytes": "-b", "--maxbytes": "-e", "--stepfactor": "-f", "--ngpus": "-g",
                   "--check": "-c", "--iters": "-n", "--warmup_iters": "-w"}
        key = aliases.get(key, key)
        if key in opts:
            opts[key] = inline or (rest.pop(0) if rest else "")
        elif key in ("-t", "--nthreads", "-d", "--datatype", "-o", "--op", "-z", "--blocking", "-G",
                     "--cudagraph", "-a", "--average", "-m", "--agg_iters"):
            if not inline and rest and not rest[0].startswith("-"):
                rest.pop(0)
        else:
            raise StubUsageError(f"invalid option -- '{arg}'")
    min_bytes, max_bytes, factor = _size(opts["-b"]), _size(opts["-e"]), int(opts["-f"])
    ngpus, check, iters, warmup = int(opts["-g"]), int(opts["-c"]), int(opts["-n"]), int(opts["-w"])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = [int(g) for g in visible.split(",")] if visible else [g.index for g in hw.gpus]
    if ngpus > len(gpus) or ngpus < 1:
        print(f"{socket.gethostname()}: Test CUDA failure common.cu:1069 'invalid device ordinal'")
        print(f" .. {socket.gethostname()} pid {os.getpid()}: Test failure common.cu:1164")
        return 2
    gpus = gpus[:ngpus]
    peak = _peak(hw, gpus)
    host = socket.gethostname()
    pid = os.getpid()
    major, minor, patch = (int(x) for x in hw.versions["nccl"].split("."))
    nccl_code = major * 10000 + minor * 100 + patch  # NCCL_VERSION_CODE
    out = [
        f"# nccl-tests version 2.13.11 nccl-headers={nccl_code} nccl-library={nccl_code}",
        f"# nThread 1 nGpus {ngpus} minBytes {min_bytes} maxBytes {max_bytes} step: {factor}(factor) "
        f"warmup iters: {warmup} iters: {iters} agg iters: 1 validation: {check} graph: 0",
        "#",
        "# Using devices",
    ]
    for rank, gpu in enumerate(gpus):
        bus = int(hw.gpus[gpu].bus_id.split(":")[1], 16)
        out.append(f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10} device {rank:2d} [0x{bus:02x}] "
                   f"{hw.gpu_name}")
    out += [
        "#",
        "#                                                              out-of-place                       in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ",
    ]
    busbw_sum, rows, errors = 0.0, 0, 0
    size = max(min_bytes, 4)
    while size <= max_bytes:
        count = size // 4
        row = f"{count * 4:12d}  {count:12d}  {'float':>8}  {'sum':>6}  {-1:6d}"
        for in_place in (False, True):
            moved = count * 4 * 2 * (ngpus - 1) / ngpus if ngpus > 1 else 0.0
            time_us = (BASE_LATENCY_US if ngpus > 1 else 2.5) + (moved / (peak * 1e3) if peak else 0.0)
            time_us *= 0.998 if in_place else 1.0
            algbw = count * 4 / time_us / 1e3
            busbw = algbw * 2 * (ngpus - 1) / ngpus
            wrong = hw.nccl_wrong if hw.nccl_wrong and count * 4 >= 1048576 else 0
            errors += 1 if wrong else 0
            wrong_text = f"{wrong:5g}" if check else f"{'N/A':>5}"
            row += f"  {_time_str(time_us)}  {algbw:6.2f}  {busbw:6.2f}  {wrong_text}"
            busbw_sum += busbw
            rows += 1
        out.append(row)
        size = size * factor if factor > 1 else size + 1
    avg = busbw_sum / rows if rows else 0.0
    out += [
        f"# Out of bounds values : {errors} {'FAILED' if errors else 'OK'}",
        f"# Avg bus bandwidth    : {avg:g} ",
        "#",
        "",
    ]
    print("\n".join(out))
    return 1 if errors else 0
