"""``clusterctl edge calibrate``: do the units' scores tell the wait their requests then have?

Glue: options -> :mod:`operate.calibrate` (a mixed load through the edge, per unit bias / MAE / correlation
of the predicted against the measured queue wait, and with ``--breaker-unit`` the circuit-breaker check) ->
the table, and with ``--out`` the report files. Exit codes: 0 no unit misleads (and the breaker held), 1 a
unit flagged or a request reached a unit out of rotation, 2 bad input or an endpoint that is not the edge.
"""

from __future__ import annotations

import os

import click

from cli import app
from cli.commands.loadtest import emit, scenario_option
from cli.endpoint import announce, endpoint_options, resolve_endpoint
from cli.help import examples
from common.errors import ClusterctlError, ExitCode

_EXAMPLES = examples(
    "clusterctl edge calibrate -i inventory/prod --rate 6 --requests 1000",
    "clusterctl edge calibrate --endpoint http://127.0.0.1:8080 --rate 6 --requests 1000",
    "clusterctl edge calibrate --endpoint 127.0.0.1:8080 --breaker-unit r01n02-iu1 --consul 127.0.0.1:8500",
    note="A unit is flagged when its bias is off the pool's by more than 50 ms and its predicted/measured "
         "scale by more than 1.5x, or its predictions do not follow its waits (operate/calibrate.py). Exit codes: 0 no unit misleads, 1 a "
         "unit flagged or the breaker check failed, 2 bad input or an endpoint that is not the EAS edge.",
)


@click.command("calibrate", epilog=_EXAMPLES)
@endpoint_options
@click.option("--rate", default="4", show_default=True, help="Requests per second (Poisson arrivals).")
@click.option("--requests", default=1000, show_default=True, type=click.IntRange(10, 1_000_000),
              help="Requests to send for the calibration.")
@scenario_option
@click.option("--prefill-tps", default=None, type=click.FloatRange(1, None, min_open=False),
              help="The units' true prefill rate, prompt tokens/s (default: the median of the rates they publish).")
@click.option("--breaker-unit", default=None, metavar="IU",
              help="Also check the circuit breaker: put IU in Consul maintenance, send --breaker-requests, count "
                   "those that reached it (must be 0), then take it out of maintenance.")
@click.option("--breaker-requests", default=100, show_default=True, type=click.IntRange(10, 100_000),
              help="Requests sent while --breaker-unit is in maintenance.")
@click.option("--consul", "consul_addr", default=None,
              help="The Consul agent the breaker unit is registered with, HOST:PORT (default CONSUL_HTTP_ADDR).")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Write the report here: JSON, Markdown and a PNG of predicted against measured waits.")
@click.option("--seed", default=1, show_default=True, type=int, help="Seed of the arrivals and request sizes.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of the table.")
def calibrate(endpoint, inventory, vault_password_file, rate, requests, scenario_path, prefill_tps, breaker_unit,
              breaker_requests, consul_addr, out_dir, seed, as_json) -> None:
    """Send a mixed load through the edge and check, unit by unit, its scores against the waits measured."""
    from operate import calibrate as calibration
    from operate.rates import parse_rate
    from operate.scenario import load_scenario

    endpoint, origin = resolve_endpoint(endpoint, inventory, vault_password_file)
    scenario = load_scenario(scenario_path)
    per_s = parse_rate(rate)
    io = None
    if breaker_unit:
        addr = consul_addr or os.environ.get("CONSUL_HTTP_ADDR")
        if not addr:
            raise ClusterctlError("--breaker-unit needs --consul HOST:PORT (or CONSUL_HTTP_ADDR)", ExitCode.USAGE)
        from consul_io.client import ConsulIO

        io = ConsulIO(addr, token=os.environ.get("CONSUL_HTTP_TOKEN") or None, timeout_s=3.0)
    announce(endpoint, origin)
    if not as_json:
        app.current().err_console.print(f"calibrating: {requests} requests at {per_s:g}/s through {endpoint}")
    result = calibration.run(endpoint, scenario, per_s, requests, prefill_tps=prefill_tps, seed=seed)
    if io is not None:
        with calibration.out_of_rotation(io, breaker_unit, endpoint):
            result.breaker = calibration.breaker_share(endpoint, scenario, breaker_unit, per_s, breaker_requests,
                                                       seed=seed + 1)
    emit(result, out_dir, as_json)
    if not result.passed:
        raise SystemExit(ExitCode.FAILED)
