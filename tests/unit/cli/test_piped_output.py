"""What clusterctl prints when stdout is not a terminal (a pipe, ``> log``, a CI log, ``| less``): whole lines,
so a table row, a node of the tree or a roles list is one line for grep, and no colour or cursor codes."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from cli import app
from preflight import report
from tests.helpers import cli_samples, run_cli

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "inventory" / "sample"
TOPO_16 = ROOT / "tests" / "fixtures" / "preflight" / "topo" / "h200-sxm-hgx-driver550-tabs.txt"


@pytest.fixture
def piped(capsys, monkeypatch):
    """``piped(*args)`` -> (exit code, stdout, stderr) of clusterctl with stdout not a terminal, as in a CI log:
    no COLUMNS, a colour terminal named by TERM (what a shell under tmux exports)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    return lambda *args: run_cli(capsys, *args)


def test_a_console_off_a_terminal_folds_no_line_and_columns_still_decides(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    console = app.make_console(file=out)
    assert not console.is_terminal and console.width == app.UNWRAPPED
    line = " ".join(["word"] * 60)
    console.print(line)
    assert out.getvalue() == line + "\n"
    monkeypatch.setenv("COLUMNS", "120")  # set by whoever runs it: their width, not ours
    assert app.make_console(file=io.StringIO()).width == 120


def test_the_inventory_tree_keeps_each_node_on_one_line(piped):
    code, out, _ = piped("inventory", "show", "-i", str(SAMPLE))
    assert code == 0 and "\x1b" not in out
    nodes = [line for line in out.splitlines() if ".mgmt.dc1.example" in line and "consul0" not in line]
    assert len(nodes) == 8
    assert all(line.endswith("h100-sxm x8  NICs: mlx5_0, mlx5_1, mlx5_2, mlx5_3") for line in nodes), nodes
    assert all(line == line.rstrip() for line in out.splitlines()), "trailing spaces in a piped tree"


def test_the_plan_keeps_each_plays_roles_on_one_line(piped, virtual_inventory):
    code, out, _ = piped("provision", "-i", str(virtual_inventory), "--plan")
    assert code == 0 and "\x1b" not in out
    roles = [line for line in out.splitlines() if "roles: cpu_cstates" in line]
    assert roles == ["  roles: cpu_cstates -> numa_tuning -> nvidia_stack -> rdma_network -> chrony -> "
                     "inference_unit -> consul_agent -> eas_agent -> host_firewall"]
    batch_4 = next(line for line in out.splitlines() if line.split()[:1] == ["4"])
    assert batch_4.split() == ["4", "3", "2", "r02n01,", "r02n02"]  # play 2: the dedicated servers' (none here)


def test_a_parsed_matrix_is_one_table_not_column_groups(piped):
    code, out, _ = piped("preflight", "parse", "topo", str(TOPO_16))
    assert code == 0 and "\x1b" not in out
    assert "columns 1-" not in out  # not split into groups that fit 80 columns
    gpu0 = next(line for line in out.splitlines() if line.startswith("│ GPU0 ") and "NV18" in line)
    assert gpu0.count("│") > 16  # the whole row: every GPU and NIC column on GPU0's line


def test_the_preflight_report_piped_has_rows_and_summary_whole(monkeypatch, capsys):
    monkeypatch.delenv("COLUMNS", raising=False)
    report.print_report(app.App().console, cli_samples.outcome(), saved="run 20270115T080000Z")
    out = capsys.readouterr().out
    assert "\x1b" not in out
    # the wide layout (rack and code columns): a failure's row is one line from its node to its code
    row = next(line for line in out.splitlines() if "r01n02" in line and "gpu_topology" in line)
    assert "NVLINK_MISSING" in row and "GPU2-GPU3 is NODE, not NVLink" in row
    summary = next(line for line in out.splitlines() if line.startswith("5 nodes: "))
    assert summary.endswith("UNREACHABLE 8  |  4.21s"), summary  # counts and timing: not folded below
