"""``clusterctl edge calibrate``: do the units' scores tell the wait their requests then have?

Glue: options -> :mod:`operate.calibrate` (a mixed load through the edge, per unit bias / MAE / correlation
of the predicted against the measured queue wait, and with ``--breaker-unit`` the circuit-breaker check) ->
the table, and with ``--out`` the report files. Exit codes: 0 every unit decided and none misleads (and the
breaker held), 1 a unit flagged, a unit left undecided (insufficient evidence after ``--max-requests``) or a
request reached a unit out of rotation, 2 bad input or an endpoint that is not the edge.

The breaker unit's maintenance is set on its own node's Consul agent: ``--consul``, else the inventory's
``consul_http_addr`` of the node running it (:mod:`cli.consul_target`), else ``CONSUL_HTTP_ADDR``.
"""

from __future__ import annotations

import click

from cli import app, consul_target
from cli.commands.loadtest import emit, scenario_option
from cli.endpoint import announce, endpoint_options, load_checked, read_api_key, resolve_endpoint
from cli.help import examples
from common.errors import ClusterctlError, ExitCode

_EXAMPLES = examples(
    "clusterctl edge calibrate -i inventory/prod --rate 6 --requests 1000",
    "clusterctl edge calibrate --endpoint http://127.0.0.1:8080 --rate 6 --requests 1000",
    "clusterctl edge calibrate -i inventory/prod --breaker-unit r01n02-iu1",
    "clusterctl edge calibrate --endpoint 127.0.0.1:8080 --breaker-unit r01n02-iu1 --consul 127.0.0.1:8500",
    note="A unit is flagged when its bias is off the pool's by more than 50 ms and its predicted/measured "
         "scale by more than 1.5x, or its predictions do not follow its waits (operate/calibrate.py); it is "
         "undecided while its answers could not have flagged a unit --detect-scale off with 99% power, and more "
         "requests are sent up to --max-requests. Exit codes: 0 every unit decided and none misleads, 1 a unit "
         "flagged or undecided, or the breaker check failed, 2 bad input or an endpoint that is not the EAS edge.",
)


@click.command("calibrate", epilog=_EXAMPLES)
@endpoint_options
@click.option("--rate", default="4", show_default=True, help="Requests per second (Poisson arrivals).")
@click.option("--requests", default=1000, show_default=True, type=click.IntRange(10, 1_000_000),
              help="Requests to send first; more follow while a unit is undecided.")
@click.option("--max-requests", default=None, type=click.IntRange(10, 1_000_000),
              help="Requests in all, at most, while units are undecided (default 3 x --requests).")
@click.option("--detect-scale", default=None, type=click.FloatRange(1.6, None),
              help="A unit is cleared only when its answers would flag one whose scale is off the pool's by this "
                   "factor with 99% power (default 2.5).")
@scenario_option
@click.option("--prefill-tps", default=None, type=click.FloatRange(1, None, min_open=False),
              help="The units' true prefill rate, prompt tokens/s (default: the median of the rates they publish).")
@click.option("--breaker-unit", default=None, metavar="IU",
              help="Also check the circuit breaker: put IU in Consul maintenance, send --breaker-requests, count "
                   "those that reached it (must be 0), then take it out of maintenance.")
@click.option("--breaker-requests", default=100, show_default=True, type=click.IntRange(10, 100_000),
              help="Requests sent while --breaker-unit is in maintenance.")
@click.option("--consul", "consul_addr", default=None,
              help="The Consul agent the breaker unit is registered with, HOST:PORT (default: the inventory's "
                   "consul_http_addr of the node running it, else CONSUL_HTTP_ADDR).")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Write the report here: JSON, Markdown and a PNG of predicted against measured waits.")
@click.option("--seed", default=1, show_default=True, type=int, help="Seed of the arrivals and request sizes.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of the table.")
def calibrate(endpoint, inventory, vault_password_file, api_key_file, rate, requests, max_requests, detect_scale, scenario_path,
              prefill_tps, breaker_unit, breaker_requests, consul_addr, out_dir, seed, as_json) -> None:
    """Send a mixed load through the edge and check, unit by unit, its scores against the waits measured."""
    from operate import calibrate as calibration
    from operate.rates import parse_rate
    from operate.scenario import load_scenario

    api_key = read_api_key(api_key_file)
    needs_inventory = not endpoint or (breaker_unit and not consul_addr)
    loaded = load_checked(inventory, vault_password_file) if inventory and needs_inventory else None
    endpoint, origin = resolve_endpoint(endpoint, inventory, vault_password_file, loaded=loaded)
    scenario = load_scenario(scenario_path)
    per_s = parse_rate(rate)
    io = None
    if breaker_unit:
        node = None
        if loaded is not None and not consul_addr:
            node = consul_target.node_of_unit(loaded, breaker_unit)
        target = consul_target.resolve_consul(consul_addr, loaded, node=node)
        if target is None:
            raise ClusterctlError("--breaker-unit needs --consul HOST:PORT, -i INVENTORY or CONSUL_HTTP_ADDR",
                                  ExitCode.USAGE)
        consul_target.announce(target)
        io = target.io(timeout_s=3.0)
    announce(endpoint, origin)
    progress = None if as_json else app.current().err_console.print
    if progress:
        progress(f"calibrating: {requests} requests at {per_s:g}/s through {endpoint}")
    result = calibration.run(endpoint, scenario, per_s, requests, max_requests=max_requests,
                             detect_scale=detect_scale or calibration.DETECT_SCALE, prefill_tps=prefill_tps, seed=seed, progress=progress,
                             api_key=api_key)
    if io is not None:
        with calibration.out_of_rotation(io, breaker_unit, endpoint):
            result.breaker = calibration.breaker_share(endpoint, scenario, breaker_unit, per_s, breaker_requests,
                                                       seed=seed + 1, api_key=api_key)
    emit(result, out_dir, as_json)
    if not result.passed:
        raise SystemExit(ExitCode.FAILED)
