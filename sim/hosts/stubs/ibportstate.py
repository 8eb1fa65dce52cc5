"""``ibportstate -C CA -P PORT -D 0 PORT [query|enable|disable|on|off]`` (infiniband-diags in rdma-core) on a local HCA
port of a simulated host: the drills' ``ib_port_down`` disables the node's InfiniBand ports with it and enables
them again (operate/drill_devices.py).

==================================  ===============================================  ==============================
case                                what it prints, exit                             source
==================================  ===============================================  ==============================
query                               ``CA/RT PortInfo:``, ``# Port info: DR path      infiniband-diags/ibportstate.c
                                    slid 65535; dlid 65535; 0 port 1``, then the     (main, show_port_info);
                                    fields, each name padded with dots to column     libibmad dump.c
                                    33 (``LinkState:....Active``,                    (mad_dump_portstates,
                                    ``PhysLinkState:....LinkUp``, Lid, SMLid, LMC,   mad_dump_field); the man
                                    widths, speeds), exit 0                          page's ``-D 0 1`` example
``disable``                         ``Initial CA/RT PortInfo:`` and the fields,      ibportstate.c (DISABLE sets
                                    ``Disable may be irreversible``, a blank line,   PortPhysicalState 3;
                                    ``After PortInfo set:`` and the fields as the    set_port_info); ibportstate(8):
                                    port now reads: LinkState Down, PhysLinkState    "InfiniBand HCA port state may
                                    Disabled; ``ibstat`` and ``ibping`` see it        be changed locally without the
                                                                                     knowledge of the Subnet
                                                                                     Manager"
``enable``                          as disable without the warning; the port reads   ibportstate.c (ENABLE sets
                                    LinkUp and Active again                          PortPhysicalState 2, Polling)
``on`` / ``off``                    ``off`` is ``disable``; ``on`` is ``enable`` on   ibportstate.c (ON: "Enable
                                    a Disabled port, else the initial block and      only if state is Disable";
                                    ``Port is already in enable state``, exit 0,     OFF falls through to DISABLE);
                                    nothing set                                      ibportstate(8)
not root: ``/dev/infiniband/umad*`` ``ibwarn: [PID] smi_gsi_port_open: Can't open    libibmad (smi_gsi_port_open,
is root's (rdma-core's udev rules)  SMI UMAD port (Permission denied) (CA:PORT)``    mad_rpc_open_port2: IBWARN to
                                    and ``ibwarn: [PID] mad_rpc_open_port2: can't    stderr); ibdiag_common.c ibexit
                                    open UMAD port (CA:PORT)`` on stderr, then       (``%s: iberror: failed: %s`` on
                                    ``ibportstate: iberror: failed: Failed to open   stdout, exit(-1)); real lines:
                                    'CA' port 'PORT'`` on stdout, exit 255           sminfo on an rxe port (Input/
                                                                                     output error, same three lines)
no such CA or port                  as above with ``Can't open UMAD port (No such    libibmad smi_gsi_port_open
                                    device) (CA:PORT)``, exit 255                    (ext_umad_get_ca_by_name);
                                                                                     the errno is this stand-in's
                                                                                     (not captured from a host)
a RoCE port (Ethernet link layer)   ``Can't open SMI UMAD port (Input/output         topograph and sminfo reports on
                                    error) (CA:PORT)`` and the rest as above,        RoCE/rxe: "Can't open SMI UMAD
                                    exit 255                                         port (Input/output error)"
==================================  ===============================================  ==============================

Not simulated: the subnet manager's sweep (an enabled port reads Active at once, where a real one goes Polling,
LinkUp and Initialize until the SM's next sweep), addressing by LID or GUID, switch ports and the peer checks of
a switch query, speed/width/mkey operations, the MLNX extended port info block of older ConnectX.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from sim.hosts.hardware import Hardware, Hca
from sim.hosts.stubs.main import SIM_RUN_DIR

FAILED = 255  # ibexit's exit(-1)
LINK = {"Active": "Active", "Down": "Down", "Initializing": "Initialize"}  # ibstat's wording -> PortInfo's
USAGE = ("Usage: ibportstate [options] <dest dr_path|lid|guid> <portnum> [<op>]\n"
         "ibportstate: this stand-in takes -C CA -P PORT -D 0 PORT [query|enable|disable|on|off]")


def _field(name: str, value: object) -> str:
    return f"{name}:".ljust(33, ".") + f"{value}"


def port_info(hw: Hardware, hca: Hca) -> str:
    """``show_port_info``'s block for a CA port addressed by direct route 0."""
    speeds = "2.5 Gbps or 5.0 Gbps or 10.0 Gbps"
    lines = [f"# Port info: DR path slid 65535; dlid 65535; 0 port {hca.port}",
             _field("LinkState", LINK.get(hca.state, hca.state)), _field("PhysLinkState", hca.phys_state),
             _field("Lid", hca.lid), _field("SMLid", 1), _field("LMC", 0),
             _field("LinkWidthSupported", "1X or 4X"), _field("LinkWidthEnabled", "1X or 4X"),
             _field("LinkWidthActive", "4X"), _field("LinkSpeedSupported", speeds),
             _field("LinkSpeedEnabled", speeds), _field("LinkSpeedActive", "10.0 Gbps"),
             _field("Mkey", "<not displayed>"), _field("MkeyLeasePeriod", 0), _field("ProtectBits", 0)]
    return "\n".join(lines) + "\n"


def _open_failed(ca: str | None, port: int, why: str, smi: bool) -> int:
    pid = os.getpid()
    what = "Can't open SMI UMAD port" if smi else "Can't open UMAD port"
    print(f"ibwarn: [{pid}] smi_gsi_port_open: {what} ({why}) ({ca}:{port})", file=sys.stderr)
    print(f"ibwarn: [{pid}] mad_rpc_open_port2: can't open UMAD port ({ca}:{port})", file=sys.stderr)
    print(f"ibportstate: iberror: failed: Failed to open '{ca}' port '{port}'")
    return FAILED


def _save(run_dir: Path, hca: Hca) -> None:
    path = run_dir / "host.json"
    host = json.loads(path.read_text())
    for entry in host["hardware"]["hcas"]:
        if entry["device"] == hca.device:
            entry["state"], entry["phys_state"] = hca.state, hca.phys_state
    tmp = path.with_name(path.name + ".ibportstate-tmp")
    tmp.write_text(json.dumps(host, indent=1))
    os.replace(tmp, path)


def main(hw: Hardware, args: list[str], run_dir: Path | None = None, euid: int | None = None) -> int:
    options, rest = {}, list(args)
    positionals = []
    while rest:
        arg = rest.pop(0)
        if arg in ("-C", "-P") and rest:
            options[arg] = rest.pop(0)
        elif arg == "-D":
            options[arg] = ""
        else:
            positionals.append(arg)
    if "-D" not in options or len(positionals) < 2 or positionals[0] != "0":
        print(USAGE, file=sys.stderr)
        return FAILED
    ca, port = options.get("-C"), int(options.get("-P", "0"), 0)
    op = positionals[2] if len(positionals) > 2 else "query"
    if op not in ("query", "enable", "disable", "on", "off"):
        print(f"ibportstate: iberror: failed: invalid operation: {op}")
        return FAILED
    if (os.geteuid() if euid is None else euid) != 0:
        return _open_failed(ca, port, "Permission denied", smi=True)
    hca = next((h for h in hw.hcas if h.device == ca and h.port == port), None)
    if hca is None:
        return _open_failed(ca, port, "No such device", smi=False)
    if hca.link_layer != "infiniband":
        return _open_failed(ca, port, "Input/output error", smi=True)
    if op == "query":
        print("CA/RT PortInfo:\n" + port_info(hw, hca), end="")
        return 0
    print("Initial CA/RT PortInfo:\n" + port_info(hw, hca), end="")
    if op == "on" and hca.phys_state != "Disabled":
        print("Port is already in enable state")
        return 0
    if op in ("disable", "off"):
        print("Disable may be irreversible")
        hca.state, hca.phys_state = "Down", "Disabled"
    else:
        hca.state, hca.phys_state = "Active", "LinkUp"
    _save(run_dir or SIM_RUN_DIR, hca)
    print("\nAfter PortInfo set:\n" + port_info(hw, hca), end="")
    return 0
