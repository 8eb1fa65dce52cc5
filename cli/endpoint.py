"""``--endpoint`` for the commands that send traffic through the edges (``loadtest``, ``edge calibrate``,
``drill``): the URL given, else the inventory's client endpoint as the cluster model reads it
(:func:`cluster.edges.client_endpoint`: the balancer, else the first edge).

One function, :func:`resolve_endpoint`, for every such command: a command that already loaded (and validated)
its inventory passes it, the others pass the path and it is loaded and validated (a bad inventory is exit 2,
nothing sent) only when ``--endpoint`` is missing.
"""

from __future__ import annotations

from pathlib import Path

import click

from cli import app
from common.errors import UsageError

HINT = "pass --endpoint http://HOST:PORT (the edges' load balancer, or an edge)"

endpoint_option = click.option(
    "--endpoint", default=None, metavar="URL",
    help="http://HOST:PORT of an OpenAI-compatible server (the EAS edge). Default: the inventory's (-i) load "
         "balancer of the edges (its 'balancers' group), else its first edge ('edges' group).")


def read_api_key(path: str | None) -> str | None:
    """The client key in ``path`` (its first line), None without one. UsageError (exit 2, nothing sent) naming
    the file when it cannot be read, holds no key, or others may read it (a key is a tenant's credential)."""
    if path is None:
        return None
    try:
        mode = Path(path).stat().st_mode
        key = Path(path).read_text().strip().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--api-key-file {path}: cannot be read ({exc.strerror or exc})") from None
    if mode & 0o077:
        raise UsageError(f"--api-key-file {path}: mode {mode & 0o777:04o} lets others read the key: chmod 600 it")
    if not key or not key[0].strip():
        raise UsageError(f"--api-key-file {path}: holds no key (the first line is the key)")
    return key[0].strip()


def endpoint_options(f):
    """``--endpoint``, and the inventory (with its vault password file) it defaults from, for a command that
    reads no inventory of its own; ``--api-key-file``, the client key an edge with client keys wants."""
    from cli.options import vault_password_file_option

    f = click.option("--api-key-file", "api_key_file", default=None, type=click.Path(dir_okay=False, path_type=str),
                     help="File (mode 0600) whose first line is the client key the edge wants (its client_keys), "
                          "sent as a bearer token.")(f)
    f = vault_password_file_option(f)
    f = click.option("-i", "--inventory", "inventory", default=None, type=click.Path(path_type=str),
                     help="Ansible inventory whose edges' load balancer (or first edge) is the default --endpoint."
                     )(f)
    return endpoint_option(f)


def load_checked(inventory: str, vault_password_file: Path | None = None):
    """The inventory loaded and validated (every problem at once, the edges' and balancers' among them: exit 2,
    nothing sent), for a command that reads no inventory of its own."""
    from cluster.ansible import inventory as inventories
    from cluster.ansible import vault

    loaded = inventories.load_inventory(inventory, vault_secrets=vault.secrets_for(vault_password_file))
    inventories.cluster_of(loaded)
    return loaded


def resolve_endpoint(endpoint: str | None, inventory: str | None = None, vault_password_file: Path | None = None,
                     loaded=None) -> tuple[str, str]:
    """(``http://HOST:PORT``, where it came from, for the operator's log line).

    ``loaded``: the command's :class:`cluster.ansible.inventory.LoadedInventory` when it has one, already
    validated (``cluster_of``): not loaded or validated twice. UsageError (exit 2) when there is neither an
    endpoint nor an inventory with edges, naming what to pass.
    """
    from operate.rates import parse_endpoint

    if endpoint:
        return parse_endpoint(endpoint), "--endpoint"
    if loaded is None and not inventory:
        raise UsageError(f"no endpoint to send to: {HINT}, or -i INVENTORY whose 'balancers' or 'edges' group "
                         "names it")
    from cluster import edges

    if loaded is None:
        loaded = load_checked(inventory, vault_password_file)
    found = edges.client_endpoint(loaded.everyone)
    if found is None:
        raise UsageError(f"{loaded.path}: no host in the '{edges.BALANCERS_GROUP}' or '{edges.EDGES_GROUP}' group "
                         f"to send to: {HINT}, or add the edges to the inventory (docs/loadtest.md)")
    kind, where = found
    return edges.url_of(where), f"the {kind} on {where.host} in {loaded.path}"


def announce(url: str, origin: str) -> None:
    """One line on stderr saying where the traffic goes when the operator did not type it."""
    if origin != "--endpoint":
        app.current().err_console.print(f"endpoint: {url} ({origin})", highlight=False)
