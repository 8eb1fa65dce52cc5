"""The preflight report as the on-call engineer reads it: snapshots at 80/100/160 columns and piped, the
failures block, host text never read as markup, result files written before the table is drawn."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from common.errors import ExitCode
from preflight import history, report
from preflight import progress as progress_view
from tests.cli import samples
from tests.cli.helpers import check_snapshot


def render(width: int | None, **kwargs) -> str:
    """What the report prints at ``width`` columns (None: piped, rich's own non-TTY default)."""
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, color_system=None)
    report.print_report(console, samples.outcome(), saved="run 20270115T080000Z", **kwargs)
    return out.getvalue()


@pytest.mark.parametrize("width", [80, 100, 160, None], ids=["80", "100", "160", "piped"])
def test_report_snapshot(width, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = render(width)
    check_snapshot(f"preflight_{width or 'piped'}.txt", text)
    fault_lines = [line for line in text.splitlines() if re.match(r"^(FAIL|ERROR|UNREACHABLE) ", line)]
    table = [line for line in text.splitlines() if line not in fault_lines]
    limit = width or 80
    assert all(len(line) <= limit for line in table), "a table line is wider than the terminal"
    assert "…" not in text, "a cell was truncated"
    # the first row of the table is a failure, not a PASS
    first_row = next(line for line in table if line.startswith("│"))
    assert "FAIL" in first_row


def test_failures_first_pass_collapsed_and_unreachable_host_is_one_row():
    text = render(160)
    assert " PASS " not in text.split("problems")[0].split("┡")[1]  # no PASS row in the table body
    assert "20 PASS/SKIP rows not shown (--show-pass lists them)" in text
    assert "every check passed on 2 nodes: r01n01, r02n01" in text
    assert text.count("host unreachable: ssh") == 2  # one table row + one fault line, not 8 + 8
    assert "all 8 checks" in text and "all but gpu_topology" in text


def test_show_pass_lists_every_row():
    text = render(160, show_pass=True)
    assert "not shown" not in text
    assert text.count("│ PASS ") == 20


def test_closing_block_is_greppable_with_codes_counts_and_exit_meaning():
    lines = render(80).splitlines()
    assert "problems (6 on 3 nodes):" in lines
    assert (
        "FAIL r01n02 iu0 gpu_topology NVLINK_MISSING: GPU2-GPU3 is NODE, not NVLink; suggested iu_layout: "
        "[[4, 5, 6, 7]] (GPUs [0, 1, 2, 3] unusable) (+1 more)"
    ) in lines  # whole, even at 80 columns
    assert "UNREACHABLE r02n02 - * HOST_UNREACHABLE: host unreachable: ssh: cannot connect to 127.0.0.1 port 1: connection refused" in lines
    assert lines[-1] == "exit code 1: a check failed"


def test_exit_line_with_only_warnings_does_not_say_every_check_passed():
    warned = [r for r in samples.results() if r.node in ("r01n01", "r02n01")]
    warned += [samples.r("r01", "r01n03", "cstates", "WARN", "CSTATE_DEEP", "deep idle states enabled: C6 (290 us)"),
               samples.r("r01", "r01n03", "time_sync", "WARN", "CLOCK_OFFSET", "offset 40 ms")]
    only_warn = replace(samples.outcome(), results=warned)
    for strict, last in ((False, "exit code 0: no check failed (2 WARN; --strict fails them)"),
                         (True, "exit code 1: a check failed (WARN counts as failure: --strict)")):
        out = io.StringIO()
        report.print_report(Console(file=out, width=100, force_terminal=False, color_system=None), only_warn, strict)
        assert out.getvalue().splitlines()[-1] == last
    clean = replace(samples.outcome(), results=[r for r in warned if r.verdict.value == "PASS"])
    out = io.StringIO()
    report.print_report(Console(file=out, width=100, force_terminal=False, color_system=None), clean)
    assert out.getvalue().splitlines()[-1] == "exit code 0: every check passed"


def test_evidence_codes_and_top_details_are_in_the_table():
    text = render(160)
    assert "│ NVLINK_MISSING " in text and "│ IB_LATENCY " in text
    assert "- ib_write_bw mlx5_2: 189.52 Gb/s < 360" in text  # the "(+1 more)" is on screen
    assert "- (+1 more in --json / the saved run)" in text  # 4 details, 3 shown


def test_host_text_is_never_markup():
    # Before: rich.errors.MarkupError ("closing tag '[/]' ... has nothing to close") from the reason cell.
    text = render(160)
    assert "exited 1: [/] oops [bold]not markup[/bold]" in text


def test_plurals():
    from common.text import plural

    assert (plural(1, "node"), plural(4, "node"), plural(1, "peer"), plural(0, "failure")) == (
        "1 node", "4 nodes", "1 peer", "0 failures")


# ------------------------------------------------------------------------------ the command


@pytest.fixture
def fake_run(monkeypatch):
    """Let ``clusterctl preflight`` run on the sample results instead of contacting hosts."""
    import preflight.runner

    monkeypatch.setattr(preflight.runner, "run_preflight", lambda *a, **k: samples.outcome())


def test_result_files_are_written_before_the_table(clusterctl, virtual_inventory, fake_run, monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("the terminal went away")

    monkeypatch.setattr(report, "print_report", broken)
    json_file, junit_file = tmp_path / "r.json", tmp_path / "r.xml"
    code, _, err = clusterctl("preflight", "-i", str(virtual_inventory), "--json", str(json_file), "--junit",
                              str(junit_file), "--state-dir", str(tmp_path / "state"))
    assert code == ExitCode.INTERNAL and "RuntimeError: the terminal went away" in err  # a bug, not a verdict
    assert json.loads(json_file.read_text())["summary"]["exit_code"] == 1
    assert "NVLINK_MISSING" in junit_file.read_text()
    assert len(history.runs(tmp_path / "state")) == 1


def test_the_suggested_diff_command_names_a_non_default_state_dir(clusterctl, virtual_inventory, fake_run,
                                                                 monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    state = tmp_path / "my state"
    code, out, _ = clusterctl("preflight", "-i", str(virtual_inventory), "--state-dir", str(state), columns=300)
    run_id = history.runs(state)[0].id
    assert f"clusterctl preflight diff previous {run_id} -i {virtual_inventory} --state-dir '{state}')" in out
    code, out, _ = clusterctl("preflight", "-i", str(virtual_inventory), columns=300)
    run_id = history.runs(history.DEFAULT_STATE_DIR)[0].id
    assert f"clusterctl preflight diff previous {run_id} -i {virtual_inventory})" in out


def test_json_alone_is_stdout_as_every_other_commands_json(clusterctl, virtual_inventory, fake_run, tmp_path):
    code, out, err = clusterctl("preflight", "-i", str(virtual_inventory), "--state-dir", str(tmp_path / "state"),
                                "--json")
    assert code == 1 and json.loads(out)["summary"]["verdicts"]["FAIL"] == 3 and "exit code 1" in err
    code, out, _ = clusterctl("preflight", "-i", str(virtual_inventory), "--json", "--state-dir",
                              str(tmp_path / "state"))
    assert code == 1 and json.loads(out)["summary"]["verdicts"]["FAIL"] == 3  # not a file named --state-dir


def test_json_dash_is_stdout_and_the_table_goes_to_stderr(clusterctl, virtual_inventory, fake_run, tmp_path):
    code, out, err = clusterctl("preflight", "-i", str(virtual_inventory), "--json", "-", "--state-dir",
                                str(tmp_path / "state"))
    assert code == 1
    assert json.loads(out)["summary"]["verdicts"]["FAIL"] == 3
    assert "exit code 1: a check failed" in err
    assert not Path("-").exists()


def test_junit_dash_is_stdout(clusterctl, virtual_inventory, fake_run, tmp_path):
    code, out, _ = clusterctl("preflight", "-i", str(virtual_inventory), "--junit", "-", "--state-dir",
                              str(tmp_path / "state"))
    assert code == 1 and out.startswith("<?xml") and "<testsuites" in out


def test_unknown_check_suggests_and_lists(clusterctl, virtual_inventory):
    code, _, err = clusterctl("preflight", "-i", str(virtual_inventory), "--checks", "nccl,gpu_helth")
    assert code == 2
    assert err.count("\n") == 1
    assert "--checks: unknown check 'gpu_helth'; did you mean 'gpu_health'? (known: gpu_topology" in err


# ------------------------------------------------------------------------------ preflight diff


def save(tmp_path, results, checks):
    outcome = samples.outcome()
    outcome.results[:] = results
    document = report.to_json(outcome)
    return history.save(tmp_path, document, {"inventory": "inv", "checks": checks}, started=1_800_000_000)


def test_diff_counts_only_verdict_changes_over_what_both_ran_and_exits_1_on_regression(clusterctl, tmp_path):
    r = samples.r
    full = [r("r01", n, c, "PASS", "OK", "ok") for n in ("a", "b") for c in ("nccl", "consul")]
    # old: only node b (a --limit run), consul FAIL. new: both nodes, consul skipped, nccl FAILs on b.
    old = save(tmp_path, [r("r01", "b", "nccl", "PASS", "OK", "ok 1.0"),
                          r("r01", "b", "consul", "FAIL", "CONSUL_AGENT_DOWN", "down")], ["nccl", "consul"])
    new = save(tmp_path, [x for x in full if x.check == "nccl" and x.node == "a"]
               + [r("r01", "b", "nccl", "FAIL", "NCCL_BW", "busbw 40 < 460")], ["nccl"])
    result = history.diff(history.load(tmp_path, old.id), history.load(tmp_path, new.id))
    assert [(c.key[1], c.key[2], c.kind) for c in result.changes] == [("b", "nccl", "regression")]
    assert (result.nodes, result.checks) == (["b"], ["nccl"])
    code, out, _ = clusterctl("preflight", "diff", old.id, new.id, "--state-dir", str(tmp_path), columns=160)
    assert code == 1
    assert "comparing the 1 common node and 1 common check" in out
    assert "1 regression" in out
    assert "consul" not in out.split("┡")[1]  # the check the new run skipped is not a row


def test_diff_reason_only_change_is_not_a_change_and_exits_0(clusterctl, tmp_path):
    r = samples.r
    a = save(tmp_path, [r("r01", "b", "nccl", "PASS", "OK", "busbw 450")], ["nccl"])
    b = save(tmp_path, [r("r01", "b", "nccl", "PASS", "OK", "busbw 455")], ["nccl"])
    code, out, _ = clusterctl("preflight", "diff", a.id, b.id, "--state-dir", str(tmp_path))
    assert (code, out.strip()) == (0, f"no verdict changed from {a.id} to {b.id}")


def test_diff_fix_is_listed_after_regressions(tmp_path):
    r = samples.r
    a = save(tmp_path, [r("r01", "a", "nccl", "FAIL", "X", "bad"), r("r01", "b", "nccl", "PASS", "OK", "ok")], ["nccl"])
    b = save(tmp_path, [r("r01", "a", "nccl", "PASS", "OK", "ok"), r("r01", "b", "nccl", "FAIL", "X", "bad")], ["nccl"])
    kinds = [c.kind for c in history.diff(history.load(tmp_path, a.id), history.load(tmp_path, b.id)).changes]
    assert kinds == ["regression", "fixed"]


def test_diff_refuses_latest_and_previous_of_two_inventories(clusterctl, tmp_path):
    """Two clusters whose host names match, run from one directory: previous/latest compare one cluster
    with the other unless -i scopes them to one inventory; run ids compare them anyway, with a note."""
    r = samples.r
    state = tmp_path / "state"

    def run_of(inventory: str, verdict: str, code: str, started: int):
        outcome = samples.outcome()
        outcome.results[:] = [r("r01", "a", "nccl", verdict, code, "x")]
        return history.save(state, report.to_json(outcome), {
            "inventory": inventory, "inventory_path": str(tmp_path / inventory), "checks": ["nccl"]}, started)

    prod_1 = run_of("prod", "PASS", "OK", 1_800_000_000)
    staging = run_of("staging", "FAIL", "NCCL_BW", 1_800_000_100)
    prod_2 = run_of("prod", "PASS", "OK", 1_800_000_200)
    code, out, err = clusterctl("preflight", "diff", "previous", "latest", "--state-dir", str(state))
    assert (code, out) == (2, "")
    assert err == (f"error: {state}: previous ({staging.id}) and latest ({prod_2.id}) are runs of different "
                   "inventories (staging vs prod): pass -i INVENTORY to compare one inventory's runs, or two run "
                   "ids to compare them anyway\n")
    code, out, err = clusterctl("preflight", "diff", "previous", "latest", "-i", str(tmp_path / "prod"),
                                "--state-dir", str(state))
    assert (code, err) == (0, "") and out.strip() == f"no verdict changed from {prod_1.id} to {prod_2.id}"
    code, out, err = clusterctl("preflight", "diff", staging.id, prod_2.id, "--state-dir", str(state))
    assert code == 0 and err == "note: comparing runs of different inventories (staging vs prod)\n"


def test_history_says_where_the_state_dir_is_and_which_checks_each_run_covered(clusterctl, tmp_path, monkeypatch):
    from preflight.checks import BY_NAME

    monkeypatch.chdir(tmp_path)
    code, out, _ = clusterctl("preflight", "history")
    assert out.strip() == f"no runs saved under .state/preflight (in {tmp_path})"
    state = tmp_path / ".state" / "preflight"
    for checks, started in ((list(BY_NAME), 1_800_000_000), (["versions"], 1_800_000_100)):
        history.save(state, report.to_json(samples.outcome()), {"inventory": "inventory/prod", "checks": checks},
                     started)
    code, out, _ = clusterctl("preflight", "history", columns=200)
    assert code == 0 and f"preflight runs in .state/preflight (in {tmp_path})" in out
    rows = [line for line in out.splitlines() if "inventory/prod" in line]
    assert f"all {len(BY_NAME)}" in rows[0] and "versions" in rows[1]
    code, out, _ = clusterctl("preflight", "history", "-i", "inventory/other")
    assert out.strip() == f"no runs saved for inventory/other under .state/preflight (in {tmp_path})"


def test_a_green_run_is_a_line_not_an_empty_table():
    outcome = samples.outcome()
    outcome.results[:] = [r for r in outcome.results if r.node in ("r01n01", "r02n01")]
    out = io.StringIO()
    report.print_report(Console(file=out, width=100, color_system=None), outcome)
    lines = out.getvalue().splitlines()
    assert lines[0] == ("every check passed on 2 nodes: r01n01, r02n01 (depth: per profile; 16 PASS/SKIP rows; "
                        "--show-pass lists them)")
    assert "┏" not in out.getvalue() and lines[-1] == "exit code 0: every check passed"


def test_a_green_run_says_which_depth_ran():
    """The report says which depth ran; a green run prints no table (whose title names it), so
    its one line does."""
    outcome = samples.outcome()
    outcome.results[:] = [r for r in outcome.results if r.node == "r01n01"]
    outcome.options = replace(outcome.options, depth="quick")
    out = io.StringIO()
    report.print_report(Console(file=out, width=200, color_system=None), outcome)
    assert out.getvalue().splitlines()[0].startswith("every check passed on 1 node: r01n01 (depth: quick; ")


def test_progress_names_the_nodes_it_waits_on():
    progress = progress_view.LiveProgress(Console(file=io.StringIO()), ["r01n01", "r01n02", "r02n01", "r02n02", "r02n03"])
    with progress:
        progress.start(5)
        assert progress.waiting_text() == "waiting on r01n01, r01n02, r02n01 (+2)"
        for node in ("r01n01", "r01n02", "r02n01", "r02n03"):
            progress.node_done(node, [])
        assert progress.waiting_text() == "waiting on r02n02"


def test_history_table_shows_saved_text_as_it_is(clusterctl, tmp_path):
    history.save(tmp_path, report.to_json(samples.outcome()), {"inventory": "inv[/]x", "limit": "[bold]r1"},
                 started=1_800_000_000)
    code, out, _ = clusterctl("preflight", "history", "--state-dir", str(tmp_path), columns=160)
    assert code == 0 and "inv[/]x" in out and "[bold]r1" in out  # before: MarkupError, exit 1


def test_progress_shows_each_running_nodes_check_and_how_long_it_has_run():
    """While long tests run (dcgm_diag -r 3 is ~15 min) the live line says, per node, which check
    it is in and for how long, not only the step some node started last."""
    now = [100.0]
    progress = progress_view.LiveProgress(Console(file=io.StringIO()), ["r01n01", "r01n02", "r01n03", "r02n01", "r02n02"],
                                   clock=lambda: now[0])
    with progress:
        progress.start(5)
        for node in ("r01n01", "r01n02", "r01n03", "r02n01"):
            progress.node_step(node, "dcgm_diag")
        now[0] += 5
        progress.node_step("r02n02", "gpu_bandwidth")
        now[0] += 130
        assert progress.running_text() == "dcgm_diag 2m15s: r01n01, r01n02, r01n03 (+1); gpu_bandwidth 2m10s: r02n02"
        progress.node_step("r01n01", "nccl")
        progress.node_done("r01n02", [])
        assert progress.running_text() == "dcgm_diag 2m15s: r01n03, r02n01; gpu_bandwidth 2m10s: r02n02; nccl 0s: r01n01"
        # the live line's last column draws that text at each refresh, the runner's phase once nothing runs
        column = next(c for c in progress._bar.columns if isinstance(c, progress_view._PhaseColumn))
        task = progress._bar.tasks[0]
        now[0] += 60
        assert column.render(task).plain.startswith("dcgm_diag 3m15s: r01n03, r02n01")
        for node in ("r01n01", "r01n03", "r02n01", "r02n02"):
            progress.node_done(node, [])
        assert progress.running_text() == ""
        progress.phase("rack checks: ib_pairs, nccl")
        assert column.render(task).plain == "rack checks: ib_pairs, nccl"
