"""Click options shared by several commands."""

import click

inventory_option = click.option(
    "-i", "--inventory", "inventory", required=True, type=click.Path(path_type=str),
    help="Ansible inventory (file or directory), loaded the way Ansible loads it.",
)
limit_option = click.option("--limit", "-l", "limit", default=None, help="Ansible host pattern, e.g. rack_r12.")
