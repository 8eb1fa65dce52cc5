"""``clusterctl agent parse-metrics FILE [--json]``: what the EAS agent reads from a saved vLLM scrape."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cli.help import examples
from common.errors import ClusterctlError, ExitCode
from eas_agent.vllm_metrics import MetricsParseError, parse_vllm_metrics


@click.group("agent", epilog=examples("clusterctl agent parse-metrics saved-metrics.txt"))
def command() -> None:
    """EAS agent helpers."""


@command.command("parse-metrics", epilog=examples("curl -s http://127.0.0.1:8000/metrics > m.txt; clusterctl agent parse-metrics m.txt --json"))
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the parse-json contract's shape.")
def parse_metrics(file: Path, as_json: bool) -> None:
    """Parse a saved vLLM /metrics scrape (V1 or V0 names; the last complete scrape of several)."""
    try:
        text = file.read_text(errors="replace")
    except OSError as exc:
        raise ClusterctlError(f"{file}: cannot read: {exc.strerror or exc}", ExitCode.USAGE) from exc
    try:
        metrics = parse_vllm_metrics(text)
    except MetricsParseError as exc:
        raise ClusterctlError(f"{file}: {exc}", ExitCode.FAILED) from exc
    if as_json:
        click.echo(json.dumps(metrics.contract_json()))
        return
    for key, value in metrics.to_json().items():
        click.echo(f"{key:28} {'-' if value is None else value}")
