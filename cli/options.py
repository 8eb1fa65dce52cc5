"""Click options shared by several commands."""

from pathlib import Path

import click

from cluster.ansible import vault
from common.text import suggest

inventory_option = click.option(
    "-i", "--inventory", "inventory", required=True, type=click.Path(path_type=str),
    help="Ansible inventory (file or directory), loaded the way Ansible loads it.",
)
limit_option = click.option("--limit", "-l", "limit", default=None, help="Ansible host pattern, e.g. rack_r12.")


def _checked_vault_password_file(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    # Checked while the options are parsed, before the inventory is read: a bad file is exit 2, one line.
    return vault.check_vault_password_file(value) if value else None


# The command gets the checked absolute path (or None); vault.secrets_for(path) gives the loader's secrets.
vault_password_file_option = click.option(
    "--vault-password-file", "vault_password_file", type=click.Path(path_type=Path), default=None,
    callback=_checked_vault_password_file,
    # The long explanation is in one place: `clusterctl --help` (cli/main.py EPILOG) and the README.
    help="Vault password file (mode 0600) or script for ansible-vault values; see `clusterctl --help`.",
)


class SuggestingChoice(click.Choice):
    """A choice whose error names the nearest valid value before the list of them (which can be long):
    ``'ncl' is unknown; did you mean 'nccl'? (one of: chrony, ...)``."""

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            choices = [str(c) for c in self.choices]
            self.fail(f"{value!r} is unknown{suggest(str(value), choices)} (one of: {', '.join(choices)})",
                      param, ctx)
