"""bench/results.py: the README's summary table is what bench/results/*.json render, and a script's
``--results`` writes a file the table can render."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import results  # noqa: E402

BENCH = Path(results.__file__).resolve().parent


def test_the_readme_table_is_what_the_result_files_render():
    readme = results.README.read_text()
    assert results.with_table(readme, results.render(results.load())) == readme, (
        "bench/README.md's table differs from bench/results/*.json: run .venv/bin/python bench/results.py")


def test_every_bench_script_with_a_result_file_exists_and_every_file_is_named_after_its_script():
    for result in results.load():
        assert (BENCH / result["script"]).is_file(), result["script"]
    for path in results.RESULTS.glob("*.json"):
        assert json.loads(path.read_text())["script"] == f"{path.stem}.py"


def test_check_refuses_what_is_not_a_result():
    good = json.loads((results.RESULTS / "push_fanout.json").read_text())
    assert results.check(dict(good)) == good
    with pytest.raises(results.ResultError, match="verdict 'pass'"):
        results.check({**good, "verdict": "pass"})
    with pytest.raises(results.ResultError, match="missing target"):
        results.check({k: v for k, v in good.items() if k != "target"})
    with pytest.raises(results.ResultError, match="numbers"):
        results.check({**good, "numbers": {}})


def test_a_stale_table_fails_the_check_and_rewriting_it_passes(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "push_fanout.json").write_text((results.RESULTS / "push_fanout.json").read_text())
    readme = tmp_path / "README.md"
    readme.write_text(f"# t\n\n{results.BEGIN}\n| old table |\n{results.END}\n\nrest\n")
    argv = ["--readme", str(readme), "--results-dir", str(tmp_path / "r")]
    assert results.main([*argv, "--check"]) == 1
    assert results.main(argv) == 0
    assert results.main([*argv, "--check"]) == 0
    text = readme.read_text()
    assert "| `push_fanout.py` |" in text and "old table" not in text and text.endswith("rest\n")


def test_a_readme_without_the_markers_is_an_error():
    with pytest.raises(results.ResultError, match="markers"):
        results.with_table("# no table here\n", "| x |")


def test_record_writes_a_renderable_file_and_keeps_what_the_run_does_not_say(tmp_path):
    path = tmp_path / "push_fanout.json"
    path.write_text(json.dumps({"measures": "one agent's push", "verdict_note": "kept"}))
    written = results.record(path, script="bench/push_fanout.py", numbers={"ratio": 0.25}, target="<= 0.5x",
                             verdict="met", summary="0.25x", host="load average 0.0 at start",
                             argv=["bench/push_fanout.py", "--edges", "16", "--results", str(path), "--window", "5"])
    assert json.loads(path.read_text()) == written
    assert written["measures"] == "one agent's push" and written["verdict_note"] == "kept"
    assert written["command"] == ".venv/bin/python bench/push_fanout.py --edges 16 --window 5"
    assert results.row(written).startswith("| `push_fanout.py` | one agent's push | <= 0.5x | ")
    assert results.record(None, script="x.py", numbers={"a": 1}, target=None, verdict="met", summary="s") is None


def test_a_pipe_in_a_cell_does_not_break_the_table():
    good = json.loads((results.RESULTS / "push_fanout.json").read_text())
    assert results.row({**good, "summary": "a | b"}).count(" | ") == 4


@pytest.mark.parametrize("argv, expected", [
    ([], None),
    (["--results"], results.RESULTS / "push_fanout.json"),
    (["--results", "/tmp/x.json"], Path("/tmp/x.json")),
])
def test_the_results_option(argv, expected):
    parser = argparse.ArgumentParser()
    results.add_argument(parser, "bench/push_fanout.py")
    assert parser.parse_args(argv).results == expected


def test_a_wired_script_hands_its_printed_numbers_to_the_result_file(tmp_path):
    import push_fanout

    def row(edges, mode, cpu_s):
        return {"edges": edges, "mode": mode, "agent_cpu_s": cpu_s, "agent_wall_s": 10.0, "wall_s": 10.0,
                "delivered": [110] * edges, "cpu_s": 0.1, "ages": [0.001, 0.002], "errors": 0}

    numbers: dict = {}
    lines = push_fanout.report(0.005, [row(1, "poll", 0.12), row(1, "stream", 0.06), row(16, "poll", 0.73),
                                       row(16, "stream", 0.22)], 11.0, numbers)
    assert numbers["agent_push_pct_of_a_core"] == {"1 edge": {"blocking": 0.7, "stream": 0.1},
                                                   "16 edges": {"blocking": 6.8, "stream": 1.7}}
    assert numbers["stream_over_blocking_16_edges"] == 0.25 and "0.25x" in lines[-1]
    written = results.record(tmp_path / "push_fanout.json", script="bench/push_fanout.py", numbers=numbers,
                             target="<= 0.5x", verdict="met", summary=lines[-1], argv=["push_fanout.py"])
    assert results.load(tmp_path) == [written]


@pytest.mark.parametrize("line, verdict", [
    ("target: added p99 (target <= 2 ms): met", "met"),
    ("target: x = 1.211 (target <= 1.2; CI straddles the limit): NOT met", "not met"),
    ("target: added p99 = 5.1 ms (target <= 2 ms): no verdict (1 of 2 kept round(s) with steal over 0.5%, "
     "re-runs spent: run it on a quieter host)", "no verdict"),
    ("16 edges: the stream costs the agent 0.25x (target <= 0.5): met", "met"),
])
def test_the_verdict_is_read_off_the_printed_target_line(line, verdict):
    assert results.verdict_of(line) == verdict


def test_a_line_without_a_verdict_is_an_error():
    with pytest.raises(results.ResultError):
        results.verdict_of("reference: 1.0 CPU-s per host is the cost of 23 no-op module tasks")


def test_the_edge_benchmark_records_the_numbers_behind_its_verdict():
    import edge_proxy

    def run(ttfb_ms):
        return {"ttfb": [ttfb_ms / 1e3] * 100, "chunk": [0.005] * 100, "late": [0.0] * 100, "achieved_rate": 200.0,
                "errors": 0}

    row = {"rate": 200.0, "cpu_s": {"edge asyncio": 0.121}, "steal": [0.001, 0.002], "redone": [0.0, 0.0],
           "round_added_p99": {"asyncio": [1.5, 2.1]},
           "paths": {"direct": run(2.0), "bare asyncio": run(3.0), "edge asyncio": run(3.5)}}
    numbers: dict = {}
    lines = edge_proxy.report_overhead([row], "asyncio", "", numbers)
    assert results.verdict_of(lines[-1]) == "met"
    assert numbers == {"added_p99_first_byte_ms_pooled": 1.5, "added_p99_per_round_ms": [1.5, 2.1],
                       "added_p50_ms": 1.5, "bare_hop_p99_ms": 1.0, "edge_own_p99_ms": 0.5,
                       "edge_cpu_ms_per_request": 1.21}


def test_the_routing_benchmark_records_its_default_modes_verdict_and_every_number():
    import route_sim
    from routesim.report import SeedCheck

    shipped, seeds = route_sim.SHIPPED, (1, 2, 3)
    checks = [SeedCheck(f"80% {shipped} p99 TTFT / oracle", seeds, (1.05, 1.08, 1.104), 1.2),
              SeedCheck(f"80% {shipped} p99 TTFT / least-conn", seeds, (0.774, 0.774, 0.774), 0.85),
              SeedCheck("80% ours (Consul only) p99 TTFT / oracle", seeds, (1.3, 1.4, 1.5), 1.2),
              SeedCheck(f"{shipped}, 16 edges p99 / 1 edge", seeds, (1.061, 1.061, 1.061), 1.1),
              SeedCheck("80% round-robin p99 TTFT / oracle", seeds, (1.9, 1.9, 1.9), None)]
    result = route_sim.shipped_result(checks)
    assert result["verdict"] == "met"  # the fallback's miss is in the numbers, not the default's verdict
    assert result["numbers"]["80% ours (Consul only) p99 TTFT / oracle"]["mean"] == 1.4
    assert result["numbers"][f"80% {shipped} p99 TTFT / least-conn"]["ci95"] == [0.774, 0.774]
    assert result["summary"] == (f"seeds 1,2,3, {shipped}: 80% p99 TTFT / oracle 1.078; 80% p99 TTFT / least-conn "
                                 "0.774; 16 edges p99 / 1 edge 1.061")
    one_seed = route_sim.shipped_result([SeedCheck(f"95% {shipped} p99 TTFT / least-conn", (1,), (1.01,), 1.0)])
    assert one_seed["verdict"] == "not met" and one_seed["numbers"][f"95% {shipped} p99 TTFT / least-conn"]["ci95"] is None


def test_record_met_writes_the_verdict_and_the_reproducing_command(tmp_path):
    path = tmp_path / "r.json"
    fields = {"numbers": {"x": 1}, "target": "x <= 1", "summary": "x 1", "host": "load average 0.1 at start"}
    assert results.record_met(path, True, script="bench/demo.py", argv=["--n", "3"], **fields) == 0
    written = json.loads(path.read_text())
    assert written["verdict"] == "met" and written["command"] == ".venv/bin/python bench/demo.py --n 3"
    assert results.record_met(path, False, script="bench/demo.py", argv=[], **fields) == 1
    assert json.loads(path.read_text())["verdict"] == "not met"

