"""``clusterctl preflight parse KIND FILE --profile P [--gpus N]``: the verdict and code the check gives, by the
check's own evaluate (preflight/parse_verdict.py), with what a paste cannot show stated."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest

from preflight import parsers
from preflight.checks import nccl
from preflight.parse_verdict import JUDGED, judge
from preflight.profiles import profile_for
from tests.helpers import run_cli

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "preflight"

# An all_reduce_perf result as it reaches a ticket: the prompt, elided rows, a hand annotation.
TICKET = """\
[ops@gpu-node07 ~]$ ./build/all_reduce_perf -b 8 -e 16G -f 2 -g 8
# nThread 1 nGpus 8 minBytes 8 maxBytes 17179869184 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    40.10    0.00    0.00      0    38.20    0.00    0.00      0
...
 17179869184    4294967296     float     sum      -1   742260   23.15   40.51      0   742000   23.15   40.51      0   <-- way too low, expected ~430
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 20.3
#
"""


def write(tmp_path: Path, text: str, name: str = "ticket.txt") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_nccl_ticket_gives_the_checks_fail_and_code(capsys, tmp_path):
    code, out, err = run_cli(capsys, "preflight", "parse", "nccl", write(tmp_path, TICKET), "--profile", "h100-sxm",
                             "--gpus", "8")
    assert code == 1, err
    assert "  busbw 40.51 GB/s at 16 GiB < 460 (8 GPUs): FAIL (NCCL_BUSBW)\n" in out
    assert "assumed: one run on all the GPUs, exit status 0" in out


def test_nccl_verdict_is_the_checks_evaluate_on_the_parse(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "preflight", "parse", "nccl", write(tmp_path, TICKET), "--profile", "h100-sxm",
                           "--json")
    data = json.loads(out)
    (result,) = data["verdict"]["results"]
    run = nccl.NcclRun(None, tuple(range(8)), tuple(nccl.all_reduce_argv(tuple(range(8)),
                                                                           profile_for("x", {"gpu_model": "h100-sxm"})["nccl"])),
                       rc=0, parsed=parsers.parse("nccl", TICKET))
    profile = profile_for("x", {"gpu_model": "h100-sxm"})
    from cluster.model import build_node
    (want,) = nccl.CHECK.evaluate([run], profile, build_node("pasted", {"gpu_model": "h100-sxm", "gpu_count": 8,
                                                                        "rack": "-"}))
    assert code == 1 and (result["verdict"], result["code"], result["reason"]) == (str(want.verdict), want.code,
                                                                                   want.reason)
    # the paste's warnings are the check's evidence too, as on a host
    assert result["evidence"]["parse_warnings"] == data["warnings"] and len(data["warnings"]) == 3


def test_the_gpu_count_comes_from_the_output_or_gpus(capsys, tmp_path):
    path = write(tmp_path, TICKET.replace("nGpus 8", "nGpus 4"))
    _, out, _ = run_cli(capsys, "preflight", "parse", "nccl", path, "--profile", "h100-sxm")
    assert "< 330 (4 GPUs): FAIL (NCCL_BUSBW)" in out
    no_header = write(tmp_path, "\n".join(line for line in TICKET.split("\n") if "nGpus" not in line), "bare.txt")
    code, _, err = run_cli(capsys, "preflight", "parse", "nccl", no_header, "--profile", "h100-sxm")
    assert code == 2 and "does not say how many GPUs ran it: pass --gpus N" in err
    code, out, _ = run_cli(capsys, "preflight", "parse", "nccl", no_header, "--profile", "h100-sxm", "--gpus", "8")
    assert code == 1 and "< 460 (8 GPUs): FAIL (NCCL_BUSBW)" in out


def test_topo_names_the_pair_that_is_not_nvlink(capsys, tmp_path):
    text = (FIXTURES / "topo" / "h100-sxm-hgx-driver535-nic-legend.txt").read_text()
    rows = text.split("\n")
    for i, row in enumerate(rows):  # GPU2-GPU3 over PCIe (NODE), both directions
        cells = re.split(r"(\s+)", row)
        if cells[0] in ("GPU2", "GPU3"):
            column = 2 * (4 if cells[0] == "GPU2" else 3)  # the cell of GPU3 / GPU2
            cells[column] = "NODE"
            rows[i] = "".join(cells)
    code, out, _ = run_cli(capsys, "preflight", "parse", "topo", write(tmp_path, "\n".join(rows)), "--profile",
                           "h100-sxm")
    assert code == 1
    failed = next(line for line in out.split("\n") if line.startswith("  iu0: "))
    assert failed.startswith("  iu0: GPU2-GPU3 is NODE, not NVLink; suggested iu_layout: [[4, 5, 6, 7]]")
    assert failed.endswith(": FAIL (NVLINK_MISSING)")
    assert "  iu1: GPUs 4,5,6,7 NVLink-connected on NUMA 1: PASS (TOPO_OK)\n" in out


def test_a_pass_read_with_parse_warnings_says_so(capsys):
    path = FIXTURES / "topo" / "h200-sxm-hgx-driver550-tabs-lost-tab.txt"
    code, out, _ = run_cli(capsys, "preflight", "parse", "topo", str(path), "--profile", "h200-sxm", "--json")
    results = json.loads(out)["verdict"]["results"]
    assert code == 0 and results and all(r["reason"].endswith("(read with 2 parse warnings)") for r in results)


def test_cpupower_header_less_paste_is_judged_with_its_warning(capsys):
    path = FIXTURES / "cpupower" / "headerless-from-analyzing-cpu.txt"
    code, out, _ = run_cli(capsys, "preflight", "parse", "cpupower", str(path), "--profile", "h100-sxm")
    assert code == 1 and "deep idle states enabled: C1E (2 us)" in out and "(CSTATES_DEEP)" in out


def test_a_kind_no_check_judges_alone_is_a_usage_error(capsys):
    path = FIXTURES / "ibstat" / sorted(p.name for p in (FIXTURES / "ibstat").glob("*.txt")
                                        if not p.name.startswith(("garbage", "truncated")))[0]
    code, _, err = run_cli(capsys, "preflight", "parse", "ibstat", str(path), "--profile", "h100-sxm")
    assert code == 2 and f"--profile works with: {', '.join(JUDGED)}" in err


def test_an_unknown_profile_is_a_usage_error(capsys, tmp_path):
    code, _, err = run_cli(capsys, "preflight", "parse", "nccl", write(tmp_path, TICKET), "--profile", "h900")
    assert code == 2 and "no preflight profile 'h900'" in err


@pytest.mark.parametrize("kind", sorted(JUDGED))
def test_every_judged_kind_gives_results_on_a_fixture(kind):
    folder = FIXTURES / kind.replace("-", "_")
    path = next(p for p in sorted(folder.glob("*.txt")) if not p.name.startswith(("garbage", "truncated")))
    result = parsers.parse(kind, path.read_text())
    results, assumed = judge(kind, result, [], "h100-sxm", 8)
    assert results and assumed and all(r.code for r in results)


def test_stdin_at_a_terminal_says_what_to_paste(capsys, monkeypatch):
    class Terminal(io.TextIOWrapper):
        def isatty(self) -> bool:
            return True

    pasted = io.BytesIO(TICKET.encode())
    pasted.name = "<stdin>"
    monkeypatch.setattr(sys, "stdin", Terminal(pasted))
    code, out, err = run_cli(capsys, "preflight", "parse", "nccl", "-", "--json")
    assert code == 0 and err == "reading nccl output from stdin (paste it, then Ctrl-D)\n"
    assert json.loads(out)["avg_busbw_gbps"] == 20.3


@pytest.mark.parametrize("fixture, verdict, code, reason", [
    ("ubuntu24.04.1-noble.txt", "PASS", "OS_OK", "Ubuntu 24.04.1 LTS"),
    ("ubuntu20.04.6-focal.txt", "FAIL", "OS_UNSUPPORTED", "Ubuntu 20.04.6 LTS (ID=ubuntu, VERSION_ID=20.04) is not a "
     "supported OS; the roles support Debian 12, Ubuntu 22.04, Ubuntu 24.04")])
def test_a_pasted_os_release_gets_the_os_support_verdict(fixture, verdict, code, reason):
    text = (FIXTURES / "os_release" / fixture).read_text()
    results, assumed = judge("os-release", parsers.parse("os-release", text), [], "h100-sxm", None)
    [result] = results
    assert (result.verdict.value, result.code, result.reason) == (verdict, code, reason)
