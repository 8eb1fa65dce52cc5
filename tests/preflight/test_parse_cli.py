"""``clusterctl preflight parse KIND FILE [--json]``: the exact contract JSON, tables, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "preflight"

# docs/contracts/parse-json.md, key for key
CONTRACT_KEYS = {
    "topo": ({"gpus", "nics", "links"}, {"gpus": {"name", "cpu_affinity", "numa_affinity", "gpu_numa_id"},
                                         "nics": {"name", "device"}}),
    "ibstat": ({"cas"}, {"cas": {"name", "ports"}}),
    "ibping": ({"transmitted", "received", "loss_pct", "rtt_min_ms", "rtt_avg_ms", "rtt_max_ms",
                "rtt_min_ms_corrected", "rtt_avg_ms_corrected", "rtt_max_ms_corrected"}, {}),
    "perftest": ({"test", "rows"}, {}),
    "nccl": ({"test", "complete", "rows", "oob_values", "avg_busbw_gbps", "errors"},
             {"rows": {"size_bytes", "count", "type", "redop", "root", "oop_time_us", "oop_algbw_gbps",
                       "oop_busbw_gbps", "oop_wrong", "ip_time_us", "ip_algbw_gbps", "ip_busbw_gbps", "ip_wrong"}}),
    "chrony": ({"reference", "stratum", "system_time_offset_s", "last_offset_s", "rms_offset_s", "leap_status"}, {}),
    "cpupower": ({"driver", "states"}, {"states": {"name", "disabled", "latency_us"}}),
    "nvsmi-q": ({"gpus"}, {"gpus": {"bus_id", "ecc_mode_current", "volatile_uncorrectable",
                                    "aggregate_uncorrectable", "remap_pending", "remap_failure",
                                    "retired_pages_pending"}}),
}
PORT_KEYS = {"port", "state", "physical_state", "rate_gbps", "link_layer", "base_lid"}
LAT_KEYS = {"bytes", "iterations", "t_min_us", "t_max_us", "t_typical_us", "t_avg_us", "t_stdev_us", "p99_us",
            "p999_us"}
BW_KEYS = {"bytes", "iterations", "bw_peak", "bw_avg", "msg_rate_mpps", "bw_unit"}


def samples(kind: str) -> list[Path]:
    folder = FIXTURES / kind.replace("-", "_")
    return sorted(p for p in folder.glob("*.txt") if not p.name.startswith(("truncated", "garbage", "broken")))


def run_json(capsys, kind: str, path: Path) -> dict:
    main(["preflight", "parse", kind, str(path), "--json"])
    captured = capsys.readouterr()
    assert captured.err == ""
    return json.loads(captured.out)


@pytest.mark.parametrize("kind", sorted(CONTRACT_KEYS))
def test_json_has_exactly_the_contract_keys_for_every_sample(capsys, kind):
    top_keys, nested = CONTRACT_KEYS[kind]
    checked = 0
    for path in samples(kind):
        data = run_json(capsys, kind, path)
        assert set(data) == top_keys | {"warnings"}, path.name  # warnings: a list, [] for a clean output
        assert isinstance(data["warnings"], list)
        for key, item_keys in nested.items():
            for item in data[key]:
                assert set(item) == item_keys, path.name
                checked += 1
        if kind == "ibstat":
            assert all(set(port) == PORT_KEYS for ca in data["cas"] for port in ca["ports"])
        if kind == "perftest":
            assert all(set(row) == (LAT_KEYS if "t_min_us" in row else BW_KEYS) for row in data["rows"])
        if kind == "topo":
            labels = [g["name"] for g in data["gpus"]] + [n["name"] for n in data["nics"]]
            # a damaged row is left out of links, and a warning names it
            left_out = [label for label in labels if label not in data["links"]]
            assert [label for label in labels if label in data["links"]] == list(data["links"]), path.name
            assert all(list(row) == labels for row in data["links"].values()), path.name
            assert all(any(f"row {label} " in w for w in data["warnings"]) for label in left_out), path.name
    assert checked or not nested


def test_json_values_are_typed_and_null_for_missing(capsys):
    data = run_json(capsys, "nccl", FIXTURES / "nccl" / "h100-sxm-broadcast-root0-no-validation-wrong-na.txt")
    row = data["rows"][-1]
    assert row["oop_wrong"] is None and row["root"] == 0 and isinstance(row["oop_busbw_gbps"], float)
    assert data["complete"] is True and isinstance(data["avg_busbw_gbps"], float) and data["errors"] == []
    chrony = run_json(capsys, "chrony", FIXTURES / "chrony" / "aws-time-sync-linklocal-chrony4.2-normal.txt")
    assert chrony == {"reference": "A9FEA97B (169.254.169.123)", "stratum": 4, "system_time_offset_s": -3.16e-05,
                      "last_offset_s": -4.104e-05, "rms_offset_s": 5.3422e-05, "leap_status": "Normal",
                      "warnings": []}
    topo = run_json(capsys, "topo", FIXTURES / "topo" / "v100-sxm2-dgx1-driver418-tabs-cpu-affinity-only.txt")
    assert topo["gpus"][0] == {"name": "GPU0", "cpu_affinity": "0-19,40-59", "numa_affinity": None,
                               "gpu_numa_id": None}


@pytest.mark.parametrize("kind", sorted(CONTRACT_KEYS))
def test_table_output_for_every_sample(capsys, kind):
    for path in samples(kind):
        main(["preflight", "parse", kind, str(path)])
        captured = capsys.readouterr()
        assert captured.err == "" and captured.out.strip(), path.name


def test_table_shows_values(capsys):
    main(["preflight", "parse", "ibstat", str(FIXTURES / "ibstat" / "a100-dgx-cx6-hdr200-one-port-down-polling.txt")])
    out = capsys.readouterr().out
    assert "Polling" in out and "mlx5_5" in out and "65535" in out


@pytest.mark.parametrize("kind", sorted(CONTRACT_KEYS))
def test_garbage_and_truncated_exit_1_with_one_line_naming_the_line(capsys, kind):
    folder = FIXTURES / kind.replace("-", "_")
    bad = [p for p in sorted(folder.glob("*.txt")) if p.name.startswith(("garbage", "truncated", "broken"))]
    assert bad
    for path in bad:
        with pytest.raises(SystemExit) as exit_info:
            main(["preflight", "parse", kind, str(path), "--json"])
        assert exit_info.value.code == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.count("\n") == 1 and captured.err.startswith(f"error: {path}: cannot parse as {kind}: line ")
        assert "Traceback" not in captured.err


def test_unknown_kind_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["preflight", "parse", "nvsmi", str(FIXTURES / "nvsmi_q" / "garbage-no-devices-found.txt")])
    assert exit_info.value.code == 2


def test_stdin_and_binary_garbage_through_the_installed_command():
    clusterctl = [sys.executable, "-c", "from cli.main import main; main()"]
    text = (FIXTURES / "cpupower" / "intel-sapphire-rapids-intel_idle-c6-disabled.txt").read_bytes()
    ok = subprocess.run([*clusterctl, "preflight", "parse", "cpupower", "-", "--json"], input=text,
                        capture_output=True, cwd=ROOT, timeout=60)
    assert ok.returncode == 0 and json.loads(ok.stdout)["states"][3] == {"name": "C6", "disabled": True,
                                                                         "latency_us": 290}
    bad = subprocess.run([*clusterctl, "preflight", "parse", "nccl", "-"], input=b"\x89PNG\r\n\x1a\n\x00\xff\xfe",
                         capture_output=True, cwd=ROOT, timeout=60)
    assert bad.returncode == 1 and bad.stdout == b""
    err = bad.stderr.decode()
    assert err.startswith("error: <stdin>: cannot parse as nccl: line 1: ") and err.count("\n") == 1


def test_table_prints_bus_ids_and_brackets_literally(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    main(["preflight", "parse", "nvsmi-q", str(FIXTURES / "nvsmi_q" / "h200-sxm-driver550-remap-failure-sram-secded.txt")])
    out = capsys.readouterr().out
    assert "00000000:AB:00.0" in out and "00000000:BA:00.0" in out
    main(["preflight", "parse", "nccl", str(FIXTURES / "nccl" / "h100-2node-all_reduce-crashed-ib-retry-exceeded.txt")])
    assert "[3] transport/net_ib.cc:1696 NCCL WARN" in capsys.readouterr().out


def rendered_tables(kind: str, path: Path, width: int | None) -> str:
    import io

    from rich.console import Console

    from cli.commands.preflight.parse import render_tables
    from preflight import parsers
    from preflight.parsers import paste_warnings, to_contract_json

    text = path.read_text(errors="replace")
    data = to_contract_json(kind, parsers.parse(kind, text), paste_warnings(text))
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, color_system=None)
    for table in render_tables(kind, data, console.width):
        console.print(table)
    return out.getvalue()


def fits(text: str, width: int | None) -> bool:
    return "…" not in text and all(len(line) <= (width or 80) for line in text.splitlines())


def test_tables_fit_80_columns_and_cut_nothing():
    """`preflight parse nccl` at 80 columns cut all 13 columns to `10…`/`fl…` (operator review L10): a
    table wider than the terminal is split into column groups, the first column (the row's key) in each.
    Two samples of every kind (all of them take ~15 s)."""
    from preflight import parsers

    for kind in sorted(parsers.PARSERS):
        for path in samples(kind)[:2]:
            try:
                assert fits(rendered_tables(kind, path, 80), 80), (kind, path.name)
            except parsers.ParseError:
                continue


@pytest.mark.parametrize("width", [80, 100, 160, None], ids=["80", "100", "160", "piped"])
def test_nccl_rows_fit_at_every_width(width):
    # even at 160 the header read `oop_algbw_g…`
    text = rendered_tables("nccl", FIXTURES / "nccl" / "a100-sxm4-8rank-all_gather-mpirun-tag-output.txt", width)
    assert fits(text, width) and "oop_algbw_gbps" in text and "ip_busbw_gbps" in text
    assert "nccl rows (columns 1-" in text  # 13 columns are ~190 wide: split even at 160


def test_an_empty_file_says_it_is_empty(capsys, tmp_path):
    # was: "cannot parse as nccl: line 0: no nccl-tests output (no '# nThread' header, table or Avg line): ''"
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["preflight", "parse", "nccl", str(tmp_path / "empty.txt")])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == f"error: {tmp_path / 'empty.txt'}: empty: no nccl output to parse\n"


def test_a_clean_parse_says_no_errors_no_warnings_in_one_line(capsys):
    path = FIXTURES / "nccl" / "h100-sxm-8gpu-all_reduce-g8-single-node.txt"
    main(["preflight", "parse", "nccl", str(path)])
    out = capsys.readouterr().out
    assert out.endswith("\nno errors\n") and "(none)" not in out  # its prompt line is a warning
    clean = FIXTURES / "chrony" / "aws-time-sync-linklocal-chrony4.2-normal.txt"
    main(["preflight", "parse", "chrony", str(clean)])
    assert capsys.readouterr().out.endswith("\nno warnings\n")
