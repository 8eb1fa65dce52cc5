"""``eas-agent run --config /etc/eas-agent/config.yml`` (the systemd unit's ExecStart)."""

from __future__ import annotations

import logging
import signal
import sys
import time

import click

from eas_agent.config import ConfigError, load_config


@click.group()
def cli() -> None:
    """EAS agent: per-IU load scores published to Consul."""


@cli.command("run")
@click.option(
    "--config",
    "config_path",
    default="/etc/eas-agent/config.yml",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Agent config file (YAML).",
)
@click.option("--log-level", default="INFO", show_default=True)
def run(config_path: str, log_level: str) -> None:
    """Collect, score and publish until SIGTERM/SIGINT."""
    logging.basicConfig(
        level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        click.echo(f"eas-agent: config error: {exc}", err=True)
        sys.exit(2)
    from eas_agent.agent import Agent
    from eas_agent.clock import ChronyOffset
    from eas_agent.collectors.gpu import GpuBackendError

    try:
        agent = Agent(config, clock_offset=ChronyOffset())
    except ConfigError as exc:
        click.echo(f"eas-agent: config error: {exc}", err=True)
        sys.exit(2)
    except (OSError, GpuBackendError) as exc:  # e.g. the listen port is taken, no NVIDIA driver
        click.echo(f"eas-agent: cannot start: {exc}", err=True)
        sys.exit(1)
    signal.signal(signal.SIGTERM, agent.request_stop)
    signal.signal(signal.SIGINT, agent.request_stop)
    logging.getLogger("eas_agent").info(
        "node %s: %d IUs, profile %s, every %.3g s, Consul %s",
        config.node,
        len(config.ius),
        config.profile,
        config.interval_s,
        config.consul.address,
    )
    agent.run()
    if agent.stop_requested_at is not None:
        logging.getLogger("eas_agent").info(
            "stopped in %.3f s (IUs marked critical: agent stopping)",
            time.monotonic() - agent.stop_requested_at,
        )


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="eas-agent")


if __name__ == "__main__":
    main()
