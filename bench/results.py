"""Benchmark results as data: each script's latest run in ``bench/results/<script>.json``, and the summary
table of bench/README.md rendered from those files.

A result file holds one run: the command, its date (UTC), the host's load as recorded (load average, the
hypervisor's steal), the numbers, the target and the verdict (``met``, ``not met`` or ``no verdict``).
A script writes its own with ``--results [PATH]`` (:func:`add_argument` and :func:`record`; without a
PATH, ``bench/results/<script>.json``). What a script does not say in a run (what it measures, a note on
its verdict) is kept from the file it replaces.

    .venv/bin/python bench/results.py           # rewrite bench/README.md's table from bench/results/
    .venv/bin/python bench/results.py --check   # exit 1 when the table differs from what the files render

A unit test runs the check, so the README's table and the files cannot drift apart.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
README = BENCH / "README.md"
VERDICTS = ("met", "not met", "no verdict")
REQUIRED = ("script", "measures", "command", "date", "host_load", "numbers", "target", "verdict", "summary")
BEGIN = "<!-- results table: rendered by bench/results.py from bench/results/*.json; do not edit by hand -->"
END = "<!-- end of results table -->"
VERDICT_WORDS = re.compile(r"(?:^|: )(met|NOT met|no verdict)\b")
HEADER = ["| script | measures | target | latest run | verdict |", "|---|---|---|---|---|"]


class ResultError(ValueError):
    """A result file that is not a result."""


def verdict_of(target_line: str) -> str:
    """The verdict a printed target line ends in ("...: met", "...: NOT met", "...: no verdict (why)")."""
    words = VERDICT_WORDS.findall(target_line)
    if not words:
        raise ResultError(f"no verdict in {target_line!r}")
    return words[-1].lower()


def default_path(script: str) -> Path:
    return RESULTS / f"{Path(script).stem}.json"


def add_argument(parser: argparse.ArgumentParser, script: str) -> None:
    """``--results [PATH]``: write this run's result file (``bench/results/<script>.json`` without a PATH)."""
    parser.add_argument("--results", nargs="?", type=Path, const=default_path(script), default=None,
                        metavar="PATH", help=f"write this run's result as JSON (default path "
                                             f"{default_path(script).relative_to(BENCH.parent)})")


def host_load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} {five:.1f} {fifteen:.1f} at the end, {os.cpu_count()} CPUs"


def load_at_start() -> str:
    """The host's one-minute load average as a run starting now records it."""
    return f"load average {os.getloadavg()[0]:.1f} at start"


def check(result: dict, where: str = "result") -> dict:
    missing = [key for key in REQUIRED if key not in result]
    if missing:
        raise ResultError(f"{where}: missing {', '.join(missing)}")
    if result["verdict"] not in VERDICTS:
        raise ResultError(f"{where}: verdict {result['verdict']!r} is none of {', '.join(VERDICTS)}")
    if not isinstance(result["numbers"], dict) or not result["numbers"]:
        raise ResultError(f"{where}: numbers must be a non-empty object")
    for key in ("script", "measures", "command", "date", "summary"):
        if not isinstance(result[key], str) or not result[key].strip():
            raise ResultError(f"{where}: {key} must be a non-empty string")
    return result


def _without_results(args: list[str]) -> list[str]:
    """``args`` less ``--results [PATH]``: the command that reproduces the numbers."""
    kept, skip = [], False
    for arg in args:
        if skip and not arg.startswith("-"):
            skip = False
            continue
        skip = arg == "--results"
        if not skip and not arg.startswith("--results="):
            kept.append(arg)
    return kept


def record(path: Path | None, *, script: str, numbers: dict, target: str | None, verdict: str, summary: str,
           host: str | None = None, argv: list[str] | None = None, **extra) -> dict | None:
    """Write one run's result to ``path`` (nothing when ``path`` is None, i.e. ``--results`` not given).
    Fields the run does not give (``measures``, ``verdict_note``) are kept from the file it replaces."""
    if path is None:
        return None
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        kept = {}
    argv = sys.argv if argv is None else argv
    result = {
        "script": Path(script).name,
        "measures": kept.get("measures", ""),
        "command": shlex.join([".venv/bin/python", f"bench/{Path(script).name}", *_without_results(argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host_load": host or host_load(),
        "numbers": numbers,
        "target": target,
        "verdict": verdict,
        "summary": summary,
    }
    if "verdict_note" in kept:
        result["verdict_note"] = kept["verdict_note"]
    result.update(extra)
    if not result["measures"]:
        result["measures"] = f"see {Path(script).name}'s section"
    check(result, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


def record_met(path: Path | None, met: bool, *, script: str, argv: list[str] | None, **fields) -> int:
    """:func:`record` with the verdict ``met`` or ``not met`` for a script whose ``main(argv)`` takes its
    arguments (None: the command line's); the script's exit code, 0 when met."""
    record(path, script=script, verdict="met" if met else "not met",
           argv=[script, *(sys.argv[1:] if argv is None else argv)], **fields)
    return 0 if met else 1


def exit_with(main, script: str) -> None:
    """``sys.exit(main())``; a failed subprocess (a stand-in, an edge that did not start) is one line naming
    the script instead of a traceback."""
    import subprocess

    try:
        sys.exit(main())
    except subprocess.SubprocessError as exc:
        sys.exit(f"{Path(script).stem}: {exc}")


def load(directory: Path = RESULTS) -> list[dict]:
    """Every result file in ``directory``, checked, in file-name order."""
    results = []
    for path in sorted(directory.glob("*.json")):
        try:
            results.append(check(json.loads(path.read_text()), str(path)))
        except ValueError as exc:
            raise ResultError(f"{path}: {exc}") from None
    return results


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def row(result: dict) -> str:
    latest = f"{result['date']}"
    if result["host_load"]:
        latest += f" ({result['host_load']})"
    latest += f": {result['summary']}"
    verdict = result["verdict"]
    if result.get("verdict_note"):
        verdict += f" ({result['verdict_note']})"
    cells = [f"`{result['script']}`", result["measures"], result["target"] or "none", latest, verdict]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def render(results: list[dict]) -> str:
    return "\n".join([*HEADER, *(row(r) for r in results)])


def with_table(readme: str, table: str) -> str:
    """``readme`` with the text between the markers replaced by ``table``."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ResultError(f"the README has no '{BEGIN}' ... '{END}' markers")
    return readme[: start + len(BEGIN)] + "\n" + table + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the README's table is out of date")
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    text = args.readme.read_text()
    wanted = with_table(text, render(load(args.results_dir)))
    if args.check:
        if wanted != text:
            print(f"{args.readme}: the results table differs from bench/results/; run bench/results.py")
            return 1
        return 0
    args.readme.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
