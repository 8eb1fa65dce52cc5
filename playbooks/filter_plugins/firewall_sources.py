"""The host_firewall role's sources as nftables wants them: ``sources | firewall_addresses`` keeps IP
addresses and CIDR prefixes as they are and resolves each host name (the inventory's ``ansible_host`` may be
one) on the controller, at provisioning, to every IPv4 and IPv6 address it has. The rules then hold
addresses only: nft would otherwise resolve names while it loads, at boot, before DNS is reachable, and fail
to load (leaving the ports open). A name that does not resolve is an error naming it; a renumbered node needs
the role to run again."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from ansible.errors import AnsibleFilterError


def _literal(source: str) -> str | None:
    try:
        return str(ipaddress.ip_network(source, strict=False)) if "/" in source else str(ipaddress.ip_address(source))
    except ValueError:
        return None


def firewall_addresses(sources: Any, resolve=socket.getaddrinfo) -> list[str]:
    addresses: list[str] = []
    unresolved = []
    for source in sources or []:
        source = str(source).strip()
        literal = _literal(source)
        if literal is not None:
            found = [literal]
        elif "/" in source or not source:
            raise AnsibleFilterError(f"host_firewall: {source!r} is neither an address, a CIDR prefix nor a host name")
        else:
            try:
                found = sorted({info[4][0] for info in resolve(source, None, 0, socket.SOCK_STREAM)})
            except OSError:
                unresolved.append(source)
                continue
        addresses += [a for a in found if a not in addresses]
    if unresolved:
        raise AnsibleFilterError(f"host_firewall: cannot resolve {', '.join(unresolved)} on the controller (set "
                                 "ansible_host, host_firewall_edges and host_firewall_controllers to addresses, or "
                                 "make the names resolve)")
    return addresses


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"firewall_addresses": firewall_addresses}
