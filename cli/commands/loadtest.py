"""``clusterctl loadtest``: a scenario's traffic mix against an OpenAI-compatible endpoint, judged by its SLOs.

Glue: options -> :mod:`operate.loadtest` (the run or the sweep) -> the verdict table, and with ``--out`` the
report files (:mod:`operate.report`). Exit codes: 0 every SLO met (a sweep: some rate met them all), 1 an
SLO missed, 2 bad input (a scenario file, an option, an unreachable endpoint: nothing was judged), 130
Ctrl-C (the partial results are printed first).

GPU utilisation comes from the agents' score bodies in Consul: ``--consul``, else the inventory's
``consul_http_addr`` (:mod:`cli.consul_target`), else ``CONSUL_HTTP_ADDR``; an inventory whose hosts set no
``consul_http_addr`` is exit 2 naming it, unless ``CONSUL_HTTP_ADDR`` is set.
"""

from __future__ import annotations

import json

import click

from cli import app, consul_target
from cli.endpoint import announce, endpoint_options, load_checked, read_api_key, resolve_endpoint
from cli.help import examples
from common.errors import ExitCode

_EXAMPLES = examples(
    "clusterctl loadtest -i inventory/prod --rate 4 --duration 120",
    "clusterctl loadtest --endpoint http://127.0.0.1:8080 --rate 4 --duration 120",
    "clusterctl loadtest --endpoint 127.0.0.1:8080 --sweep 2:12:2 --duration 60 --out reports/lt",
    "clusterctl loadtest --endpoint 127.0.0.1:8080 --scenario my-mix.yml --consul 127.0.0.1:8500",
    note="The default scenario is the production mix (A 65% ~327 prompt tokens, B 30% ~4,218, C 5% "
         "~12,842; p99 TTFT <= 850 / 2,200 / 5,500 ms): docs/loadtest.md. Exit codes: 0 every SLO met, 1 an "
         "SLO missed, 2 bad input or an unreachable endpoint, 130 interrupted (partial results printed).",
)


def scenario_option(f):
    return click.option("--scenario", "scenario_path", default=None, type=click.Path(dir_okay=False),
                        help="Scenario file (YAML; default: the production mix, operate/scenarios/production-mix.yml)."
                        )(f)


def sampler_factory(target, datacenter: str | None):
    """A factory of GPU utilisation samplers over the agents' bodies (:class:`cli.consul_target.ConsulTarget`),
    or None without a Consul agent to read."""
    if target is None:
        return None
    from consul_io import layout
    from operate.utilisation import UtilisationSampler

    io = target.io(timeout_s=3.0)
    return lambda: UtilisationSampler(io, datacenter or target.dc or layout.DEFAULT_DATACENTER)


def emit(result, out_dir: str | None, as_json: bool) -> None:
    """The verdict (table or JSON) on stdout and the report files under ``out_dir``."""
    from operate import report

    current = app.current()
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2, default=str))
    else:
        current.console.print(result.render())
    if out_dir:
        written, note = report.write(result, out_dir)
        current.err_console.print(f"report: {', '.join(str(p) for p in written)}")
        if note:
            current.err_console.print(note)


@click.command("loadtest", epilog=_EXAMPLES)
@endpoint_options
@click.option("--rate", default="2", show_default=True, help="Requests per second (Poisson arrivals).")
@click.option("--sweep", default=None, metavar="RATES",
              help="Rates to try in turn, LO:HI:STEP or R1,R2,...: reports the goodput (the highest rate at "
                   "which every class met its SLOs); stops at the first rate that misses one.")
@click.option("--duration", default=60.0, show_default=True, type=click.FloatRange(1, 86400),
              help="Seconds of sending per rate (answers still streaming are awaited).")
@scenario_option
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Write the report here: JSON, Markdown and PNG plots.")
@click.option("--consul", "consul_addr", default=None,
              help="Consul HOST:PORT holding the agents' score bodies: GPU utilisation per unit over the run "
                   "(default: the inventory's (-i) consul_http_addr, else CONSUL_HTTP_ADDR; without any, none is "
                   "read).")
@click.option("--dc", "datacenter", default=None, help="Datacenter of the score keys (default dc1).")
@click.option("--timeout", "timeout_s", default=120.0, show_default=True, type=click.FloatRange(0.1, 3600),
              help="Seconds one request may take before it counts as a timeout.")
@click.option("--seed", default=1, show_default=True, type=int, help="Seed of the arrivals and request sizes.")
@click.option("--min-samples", default=50, show_default=True, type=click.IntRange(1, None),
              help="Requests a class needs for its p99 to be judged (fewer: 'too few', never met).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of the table.")
def command(endpoint, inventory, vault_password_file, api_key_file, rate, sweep, duration, scenario_path, out_dir, consul_addr, datacenter, timeout_s, seed,
            min_samples, as_json) -> None:
    """Send a scenario's traffic mix open-loop and judge each class against its p99 latency targets."""
    from operate import loadtest
    from operate.rates import parse_rate, parse_sweep
    from operate.scenario import load_scenario

    api_key = read_api_key(api_key_file)
    loaded = load_checked(inventory, vault_password_file) if inventory and not (endpoint and consul_addr) else None
    endpoint, origin = resolve_endpoint(endpoint, inventory, vault_password_file, loaded=loaded)
    scenario = load_scenario(scenario_path)
    rates = parse_sweep(sweep) if sweep else None
    single = parse_rate(rate)
    consul = consul_target.resolve_consul(consul_addr, loaded)
    factory = sampler_factory(consul, datacenter)
    announce(endpoint, origin)
    consul_target.announce(consul)
    console = None if as_json else app.current().err_console
    common = {"seed": seed, "timeout_s": timeout_s, "console": console, "min_samples": min_samples,
              "api_key": api_key}
    if rates:
        result = loadtest.sweep(endpoint, scenario, rates, duration, sampler_factory=factory, **common)
        interrupted = any(r.interrupted for r in result.results)
    else:
        result = loadtest.run(endpoint, scenario, single, duration, sampler=factory() if factory else None, **common)
        interrupted = result.interrupted
    emit(result, out_dir, as_json)
    if interrupted:
        raise SystemExit(ExitCode.INTERRUPTED)
    if not result.passed:
        raise SystemExit(ExitCode.FAILED)
