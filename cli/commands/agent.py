"""``clusterctl agent parse-metrics FILE [--json]``: what the EAS agent reads from a saved vLLM scrape."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cli.help import SuggestingGroup, examples
from common.errors import ClusterctlError, ExitCode
from eas_agent.vllm_metrics import MetricsParseError, parse_vllm_metrics
from preflight.parsers.common import paste_lines, shell_prompt


@click.group("agent", cls=SuggestingGroup, epilog=examples("clusterctl agent parse-metrics saved-metrics.txt"))
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
    scrape, pasted = without_paste_additions(text)
    try:
        metrics = parse_vllm_metrics(scrape)
    except MetricsParseError as exc:
        raise ClusterctlError(f"{file}: {exc}", ExitCode.FAILED) from exc
    warnings = pasted + list(metrics.warnings)
    if as_json:
        click.echo(json.dumps({**metrics.contract_json(), "warnings": warnings}))
        return
    values = metrics.to_json()
    for key, value in values.items():
        if value is not None:
            click.echo(f"{key:28} {value}")
    absent = [key for key, value in values.items() if value is None]
    if absent:
        click.echo(f"not in this scrape: {', '.join(absent)}")
    for warning in warnings:
        click.echo(f"warning: {warning}")


def without_paste_additions(text: str) -> tuple[str, list[str]]:
    """A scrape pasted from a ticket as the exporter printed it, and what the paste added (the warnings of
    ``clusterctl preflight parse``): hand annotations cut off, elision and shell prompt lines blanked (so
    that an error still names the line of the file), non-breaking spaces made spaces."""
    kept, warnings = paste_lines(text)
    by_number = {line.no: line.text for line in kept if not shell_prompt(line.text)}
    count = text.replace("\r\n", "\n").count("\n") + 1
    return "\n".join(by_number.get(no, "") for no in range(1, count + 1)), warnings
