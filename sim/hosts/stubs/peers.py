"""The other simulated hosts of the same inventory, as a two-host tool (perftest, ibping, NCCL) sees them.

``clusterctl virtual up`` writes ``<state dir>/peers.json``: every host's addresses (inventory name and
``ansible_host``) and every HCA port's LID and GUID. A stub resolves its peer there and reads the peer's
hardware description, so a fault on either end of a link shows on the client, as on a real fabric.
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.hosts.hardware import Hardware, Hca
from sim.hosts.stubs import main as stub_main


def _index(run_dir: Path | None = None) -> tuple[Path, dict]:
    run_dir = run_dir or stub_main.SIM_RUN_DIR
    state_dir = Path(json.loads((run_dir / "host.json").read_text())["state_dir"])
    return state_dir, json.loads((state_dir / "peers.json").read_text())


def peer_hardware(host: str, run_dir: Path | None = None) -> Hardware | None:
    state_dir, _ = _index(run_dir)
    path = state_dir / host / "state" / "host.json"
    if not path.exists():
        return None
    return Hardware.from_json(json.loads(path.read_text())["hardware"])


def host_by_address(address: str, run_dir: Path | None = None) -> str | None:
    return _index(run_dir)[1]["addresses"].get(address)


def address_of(host: str, run_dir: Path | None = None) -> str:
    return _index(run_dir)[1].get("hosts", {}).get(host, host)


def port_by_lid(lid: int, run_dir: Path | None = None) -> tuple[str, str] | None:
    """(host, device) owning ``lid``."""
    found = _index(run_dir)[1]["lids"].get(str(lid))
    return tuple(found) if found else None


def port_by_guid(guid: str, run_dir: Path | None = None) -> tuple[str, str] | None:
    found = _index(run_dir)[1]["guids"].get(guid.lower().removeprefix("0x").rjust(16, "0"))
    return tuple(found) if found else None


def hca_named(hw: Hardware, device: str | None) -> Hca | None:
    if not hw.hcas:
        return None
    if device is None:
        return hw.hcas[0]
    return next((h for h in hw.hcas if h.device == device), None)


def write_index(state_dir: Path, hosts: dict[str, tuple[Hardware, str]]) -> None:
    """hosts: name -> (hardware, address)."""
    addresses: dict[str, str] = {}
    host_addresses = {name: address for name, (_, address) in hosts.items()}
    lids: dict[str, list[str]] = {}
    guids: dict[str, list[str]] = {}
    for name, (hw, address) in hosts.items():
        addresses[name] = name
        addresses[address] = name
        for hca in hw.hcas:
            if hca.link_layer == "infiniband":
                lids[str(hca.lid)] = [name, hca.device]
            guids[hca.guid] = [name, hca.device]
    index = {"hosts": host_addresses, "addresses": addresses, "lids": lids, "guids": guids}
    (state_dir / "peers.json").write_text(json.dumps(index))
