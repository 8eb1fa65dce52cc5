#!/usr/bin/python
# Part of clusterctl. Apache-2.0.
"""Wait until HAProxy sends new requests to a server again, as HAProxy itself says on its stats socket."""

from __future__ import annotations

DOCUMENTATION = r"""
module: haproxy_server_ready
short_description: Wait until HAProxy has a server of a backend back in rotation
description:
  - >-
    Asks HAProxy's stats socket (C(show servers state BACKEND), HAProxy's management guide, "show servers
    state": format version 1, columns named on its second line) every I(poll) seconds until I(server) is
    running (C(srv_op_state) 2, SRV_ST_RUNNING) with no maintenance or drain flag in C(srv_admin_state)
    (0x01 FMAINT, 0x02 IMAINT, 0x04 CMAINT, 0x08 FDRAIN, 0x10 IDRAIN, 0x20 RMAINT), and fails when that does
    not happen within I(timeout), naming the state it last saw.
  - >-
    A server an operator put in maintenance or drain (a flag HAProxy's checks never clear) fails at once.
  - >-
    Nothing to wait for, and not a failure: no socket at I(socket) (HAProxy not installed or configured there
    yet; C(balancer=absent)), a socket nobody answers on (HAProxy stopped; C(balancer=down), with a warning),
    a backend without I(server) (the balancer's configuration does not list it yet; C(listed=false)). A
    backend HAProxy does not know fails: the socket is not the balancer's.
  - >-
    Reads only (the socket's C(level user) suffices); changed is always false.
options:
  socket:
    description: Path of HAProxy's stats socket (its C(stats socket) line).
    type: path
    required: true
  backend:
    description: The backend holding I(server).
    type: str
    required: true
  server:
    description: The server's name in I(backend).
    type: str
    required: true
  timeout:
    description: Seconds to wait.
    type: int
    default: 60
  poll:
    description: Seconds between two questions to HAProxy.
    type: float
    default: 0.5
author: clusterctl maintainers
"""

RETURN = r"""
balancer:
  description: C(up) (HAProxy answered), C(absent) (no socket) or C(down) (nobody answers on it).
  returned: always
  type: str
listed:
  description: Whether I(backend) has I(server); null when HAProxy did not answer.
  returned: always
  type: bool
in_rotation:
  description: Whether HAProxy sends new requests to I(server); null when it was not asked or did not list it.
  returned: always
  type: bool
waited_s:
  description: Seconds from the first question to the answer that ended the wait.
  returned: always
  type: float
server_state:
  description: The server's row of C(show servers state), by column name (strings), as last seen.
  returned: when listed
  type: dict
"""

import socket as sockets  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

OP_STATES = {"0": "stopped (down)", "1": "starting (slowstart)", "2": "running", "3": "stopping (soft-stop)"}
RUNNING = "2"
# srv_admin_state flags that keep new requests off the server and that no health check clears.
HELD = {0x01: "forced maintenance", 0x02: "maintenance inherited from a tracked server",
        0x04: "maintenance by configuration (disabled)", 0x08: "forced drain", 0x10: "drain inherited from a tracked "
        "server", 0x20: "maintenance for a failed address resolution"}
READ_LIMIT = 1 << 20


class NoSuchBackend(Exception):
    pass


def ask(path: str, command: str, timeout_s: float = 5.0) -> str:
    """One command on the stats socket (non-interactive: HAProxy answers and closes), its whole answer."""
    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        conn.connect(path)
        conn.sendall(command.encode() + b"\n")
        chunks, size = [], 0
        while size < READ_LIMIT:
            chunk = conn.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    return b"".join(chunks).decode(errors="replace")


def parse_servers_state(text: str, backend: str) -> dict[str, dict[str, str]]:
    """``show servers state`` -> {server name: {column: value}}; NoSuchBackend for HAProxy's refusal."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or lines[0].strip() != "1":
        if any("find backend" in line for line in lines):
            raise NoSuchBackend(backend)
        raise ValueError(f"not a version 1 'show servers state' answer: {text[:200]!r}")
    header = next((line.lstrip("#").split() for line in lines[1:] if line.startswith("#")), None)
    if not header or "srv_name" not in header:
        raise ValueError(f"no column header in the answer: {text[:200]!r}")
    rows = {}
    for line in lines[1:]:
        if line.startswith("#"):
            continue
        row = dict(zip(header, line.split(), strict=False))  # a later HAProxy may add columns
        if row.get("be_name") == backend and "srv_name" in row:
            rows[row["srv_name"]] = row
    return rows


def held_by(row: dict[str, str]) -> list[str]:
    """The maintenance and drain flags set in the row's srv_admin_state."""
    admin = int(row.get("srv_admin_state", "0"))
    return [what for flag, what in HELD.items() if admin & flag]


def describe(row: dict[str, str]) -> str:
    op = row.get("srv_op_state", "?")
    return (f"op state {op} ({OP_STATES.get(op, 'unknown')}), admin state {row.get('srv_admin_state', '?')}, "
            f"check health {row.get('srv_check_health', '?')}, last check result {row.get('srv_check_result', '?')}")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "socket": {"type": "path", "required": True},
            "backend": {"type": "str", "required": True},
            "server": {"type": "str", "required": True},
            "timeout": {"type": "int", "default": 60},
            "poll": {"type": "float", "default": 0.5},
        },
        supports_check_mode=True,
    )
    p = module.params
    where = f"HAProxy at {p['socket']}: server {p['backend']}/{p['server']}"
    started = time.monotonic()
    row = None
    while True:
        waited = round(time.monotonic() - started, 2)
        try:
            rows = parse_servers_state(ask(p["socket"], f"show servers state {p['backend']}"), p["backend"])
        except FileNotFoundError:
            module.exit_json(changed=False, balancer="absent", listed=None, in_rotation=None, waited_s=waited)
        except ConnectionRefusedError:
            module.warn(f"{p['socket']}: nobody answers (HAProxy stopped?): not waiting for {p['server']}")
            module.exit_json(changed=False, balancer="down", listed=None, in_rotation=None, waited_s=waited)
        except NoSuchBackend:
            module.fail_json(msg=f"{where}: HAProxy has no backend {p['backend']!r}: is this the balancer's socket?",
                             balancer="up", listed=False, in_rotation=None, waited_s=waited)
        except (TimeoutError, ValueError):
            rows = None  # a slow or torn answer: ask again
        except OSError as exc:
            module.fail_json(msg=f"{p['socket']}: {exc}", balancer="up", listed=None, in_rotation=None,
                             waited_s=waited)
        if rows is not None:
            row = rows.get(p["server"])
            if row is None:
                module.exit_json(changed=False, balancer="up", listed=False, in_rotation=None, waited_s=waited)
            held = held_by(row)
            if held:
                module.fail_json(msg=f"{where} is held out of rotation ({', '.join(held)}; {describe(row)}): its "
                                 "checks cannot bring it back; `set server BACKEND/SERVER state ready` on the admin "
                                 "socket does", balancer="up", listed=True, in_rotation=False, waited_s=waited,
                                 server_state=row)
            if row.get("srv_op_state") == RUNNING:
                module.exit_json(changed=False, balancer="up", listed=True, in_rotation=True, waited_s=waited,
                                 server_state=row)
        if waited >= p["timeout"]:
            seen = describe(row) if row else "no answer from HAProxy"
            module.fail_json(msg=f"{where} not back in rotation within {p['timeout']} s ({seen})", balancer="up",
                             listed=row is not None, in_rotation=False, waited_s=waited, server_state=row or {})
        time.sleep(p["poll"])


if __name__ == "__main__":
    main()
