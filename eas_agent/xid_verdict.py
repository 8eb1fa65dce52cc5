"""Which XIDs take a unit out of rotation: the agent marks an IU ``critical`` (its status in the score body, the
agent's verdict in Consul, which the edges stop routing to) while one of its GPUs' latest XID is a catalogued
one whose NVIDIA action is not "ignore", and was received no longer than ``hold_s`` ago.

The table (:mod:`eas_agent.xid_actions`) is the controller's XID catalogue (``operate/xid_catalog.yml``:
NVIDIA's "Resolution Bucket (Immediate Action)" per XID and the remediation rung) reduced to what the agent
acts on; the agent is installed without the controller's packages, so it carries a generated copy, which a
unit test keeps equal to the catalogue (``operate.xid_catalog.agent_table``).

- NVIDIA's bucket ``IGNORE`` (the application keeps running: e.g. 43, a channel the driver already reset; 92,
  single-bit errors corrected in hardware): no verdict, the unit stays in rotation.
- Any other catalogued bucket (an application restart, a GPU reset, a bare-metal restart, a support case,
  or one of the investigatory WORKFLOW_* procedures such as 48's DBE): critical, the reason naming the GPU,
  the XID, its mnemonic, NVIDIA's action and the remediation rung.
- An XID not in the table: no verdict (its count still reaches the rollout's XID gate).

Why a hold and not "until the agent restarts": the agent sees no repair. A unit whose engine restarted, or
whose GPU was reset by ``clusterctl remediate``, would stay out of rotation until the agent happened to
restart; the hold (default 600 s, the agent's ``xid_hold_s``) keeps the unit out long enough for the edges to
stop routing and for an operator or ``clusterctl remediate`` to act (whose drain keeps it out after), and lets
a unit that recovered by itself come back. A GPU that stays broken stays critical on its own evidence (lost,
volatile uncorrectable ECC errors).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from eas_agent.xid_actions import XID_ACTIONS

XID_HOLD_S = 600.0
INFORMATIONAL_BUCKET = "IGNORE"  # NVIDIA: nothing to do while the application runs


@dataclass(frozen=True)
class XidAction:
    xid: int
    mnemonic: str
    bucket: str  # NVIDIA's Resolution Bucket (Immediate Action)
    rung: str  # clusterctl remediate's first rung for it


TABLE = {xid: XidAction(xid, *row) for xid, row in XID_ACTIONS.items()}


def takes_out(action: XidAction | None) -> bool:
    return action is not None and action.bucket != INFORMATIONAL_BUCKET


def xid_verdict(gpus: Iterable, now: float, hold_s: float = XID_HOLD_S, table: Mapping[int, XidAction] = TABLE
                ) -> str | None:
    """The reason to mark the IU critical, or None. ``gpus``: its GpuReadings (``xid_last``, ``xid_last_at``:
    when it happened on the agent's wall clock, NVML's drain or the kernel log's record; ``now`` on that clock). The newest XID that
    takes the unit out wins; one received more than ``hold_s`` ago, or without a time, does not count."""
    found = None
    for gpu in gpus:
        action = table.get(gpu.xid_last) if gpu.xid_last is not None else None
        at = gpu.xid_last_at
        if not takes_out(action) or at is None or now - at > hold_s:  # a clock stepped back: still new
            continue
        if found is None or at > found[1]:
            found = (gpu.index, at, action)
    if found is None:
        return None
    index, at, action = found
    return (f"GPU {index}: XID {action.xid} {action.mnemonic} {max(0.0, now - at):.0f} s ago (NVIDIA's action "
            f"{action.bucket}; remediation rung {action.rung})")
