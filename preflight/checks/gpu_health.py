"""gpu_health: memory errors, XIDs, persistence mode and (on NVSwitch boards) the fabric manager.

Gathers ``nvidia-smi -q`` (NVML's view, read on the host: NVML cannot be asked remotely), the kernel
log of the last ``health.xid_window_hours`` (``journalctl -k``, falling back to ``dmesg``) and, on
NVSwitch boards, the GPUs' own fabric state from ``nvidia-smi -q`` (``systemctl is-active
nvidia-fabricmanager`` on drivers that do not print it). Volatile uncorrectable ECC > 0, a pending or
failed row remap, pending page retirement, a critical XID (the azurehpc-health-checks list) or an
untrained NVSwitch fabric -> FAIL; any other XID -> WARN; persistence mode off where the profile
requires it -> FAIL.

Fault codes: ECC_UNCORRECTABLE, ROW_REMAP_PENDING, ROW_REMAP_FAILED, RETIRED_PAGES_PENDING, XID_CRITICAL,
XID_OTHER, PERSISTENCE_OFF, FABRIC_MANAGER_DOWN, FABRIC_UNKNOWN, GPU_HEALTH_OK.
"""

from __future__ import annotations

import re
from typing import Any

from preflight.checks.base import Check, GatherError, NodeContext, excerpt, parse_output
from preflight.result import CheckResult, Verdict

NVSMI_Q = ["nvidia-smi", "-q"]
FABRIC_MANAGER = ["systemctl", "is-active", "nvidia-fabricmanager"]
SYSTEMD_STATES = ("inactive", "failed", "activating", "deactivating", "reloading", "unknown", "maintenance")
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+)")
_GPU_SECTION = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$")
_KEY_VALUE = re.compile(r"^\s*([^:]+?)\s*:\s*(.*?)\s*$")


def nvsmi_q_fields(text: str) -> dict[str, Any]:
    """Header fields and per-GPU persistence mode from ``nvidia-smi -q`` (keys the shared parser leaves out).

    {"driver": "550.90.07", "cuda": "12.4", "persistence": {"00000000:1B:00.0": "Enabled"},
     "fabric": {"00000000:1B:00.0": {"state": "Completed", "status": "Success"}}}

    ``Fabric`` (drivers >= R530 on NVSwitch boards) is the GPU's own view of its NVSwitch fabric
    registration, which the fabric manager performs: the effective state, not whether a unit is running.
    """
    out: dict[str, Any] = {"driver": None, "cuda": None, "persistence": {}, "fabric": {}}
    bus_id = None
    in_fabric = False
    for raw in text.replace("\r", "").splitlines():
        section = _GPU_SECTION.match(raw.strip())
        if section:
            bus_id = section.group(1).upper()
            continue
        indent = len(raw) - len(raw.lstrip())
        if raw.strip() == "Fabric":
            in_fabric = True
            continue
        if in_fabric and indent <= 4:
            in_fabric = False
        match = _KEY_VALUE.match(raw)
        if not match:
            continue
        key, value = match.groups()
        if in_fabric and bus_id and key in ("State", "Status"):
            out["fabric"].setdefault(bus_id, {})[key.lower()] = value
            continue
        if key == "Driver Version" and out["driver"] is None:
            out["driver"] = value
        elif key in ("CUDA Version", "CUDA Driver Version") and out["cuda"] is None:
            out["cuda"] = value
        elif key == "Persistence Mode" and bus_id:
            out["persistence"][bus_id] = value
    return out


def short_bus(bus_id: str) -> str:
    """The PCI bus number: 00000000:1B:00.0 (nvidia-smi), 0000:1b:00 or 1b:00 (kernel log) -> '1b'.

    The bus alone is what every spelling has in common (each GPU sits on its own bus behind its switch).
    """
    parts = bus_id.lower().split(":")
    return parts[1] if len(parts) >= 3 else parts[0]


def xids_in(log: str) -> list[tuple[str, int, str]]:
    """(bus, xid, line) for every NVRM Xid line of a kernel log."""
    found = []
    for line in log.splitlines():
        match = _XID.search(line)
        if match:
            found.append((short_bus(match.group(1)), int(match.group(2)), line.strip()[:200]))
    return found


class GpuHealth(Check):
    name = "gpu_health"
    codes = {
        "ECC_UNCORRECTABLE": "volatile uncorrectable ECC errors > 0",
        "ROW_REMAP_PENDING": "a row remap is pending (needs a GPU reset)",
        "ROW_REMAP_FAILED": "row remapping failed (RMA candidate)",
        "RETIRED_PAGES_PENDING": "page retirement pending (needs a GPU reset)",
        "XID_CRITICAL": "a critical XID (azurehpc-health-checks list) in the kernel log window",
        "XID_OTHER": "another XID in the kernel log window",
        "PERSISTENCE_OFF": "persistence mode disabled",
        "FABRIC_MANAGER_DOWN": "NVSwitch fabric not trained / nvidia-fabricmanager not active",
        "FABRIC_UNKNOWN": "neither the GPUs nor systemd tell whether the fabric manager runs (WARN)",
    }

    def fabric_state(self, ctx: NodeContext, fields: dict[str, Any]) -> tuple[Verdict, str]:
        """NVSwitch fabric: the GPUs' Fabric State (R530+), else the fabric manager unit's state."""
        if fields["fabric"]:
            bad = {
                bus: f"{v.get('state')}/{v.get('status')}"
                for bus, v in fields["fabric"].items()
                if (v.get("state"), v.get("status")) != ("Completed", "Success")
            }
            if bad:
                bus, state = next(iter(bad.items()))
                return Verdict.FAIL, (
                    f"NVSwitch fabric not trained on {len(bad)} GPUs (GPU {bus}: {state}); "
                    "is nvidia-fabricmanager running?"
                )
            return Verdict.PASS, f"fabric Completed/Success on {len(fields['fabric'])} GPUs"
        unit = ctx.run(FABRIC_MANAGER)
        state = unit.stdout.strip()
        if state == "active":
            return Verdict.PASS, "nvidia-fabricmanager active"
        if state in SYSTEMD_STATES:
            return Verdict.FAIL, f"nvidia-fabricmanager is {state} (NVSwitch board)"
        return (
            Verdict.WARN,
            f"cannot tell whether nvidia-fabricmanager runs: {unit.last_line() or 'no output'}",
        )

    def kernel_log(self, ctx: NodeContext) -> str:
        hours = ctx.profile["health"]["xid_window_hours"]
        result = ctx.run(["journalctl", "-k", "--no-pager", "-q", "--since", f"-{hours:g}h"])
        if result.ok:
            return result.stdout
        return ctx.output(["dmesg"])  # no journal (or no permission): the ring buffer, i.e. this boot

    def run(self, ctx: NodeContext) -> list[CheckResult]:
        node = ctx.node
        health = ctx.profile["health"]
        try:
            text = ctx.output(NVSMI_Q)
            report = parse_output("nvsmi-q", text, "nvidia-smi -q")
            if report.attached is not None and len(report.gpus) < report.attached:
                # The parser takes one whole block as `-q -i N`; here every GPU was asked for.
                raise GatherError(f"`nvidia-smi -q` printed {len(report.gpus)} of {report.attached} attached GPUs",
                                  command="nvidia-smi -q", output=excerpt(text))
            gpus = report.gpus
            fields = nvsmi_q_fields(text)
            log = self.kernel_log(ctx)
            fabric = self.fabric_state(ctx, fields) if ctx.profile["gpu"]["nvswitch"] else None
        except GatherError as exc:
            return [self.error(node, exc)]

        index_of_bus = {short_bus(g.bus_id): i for i, g in enumerate(gpus)}
        iu_of_gpu = {g: iu.id for iu in node.ius for g in iu.gpus}

        def where(i: int) -> str:
            return f"GPU{i}" + (f" ({iu_of_gpu[i]})" if i in iu_of_gpu else "")

        problems: list[tuple[Verdict, str, str]] = []
        for i, gpu in enumerate(gpus):
            if (gpu.volatile_uncorrectable or 0) > 0:
                problems.append(
                    (
                        Verdict.FAIL,
                        "ECC_UNCORRECTABLE",
                        f"{where(i)}: {gpu.volatile_uncorrectable} volatile uncorrectable ECC errors",
                    )
                )
            if gpu.remap_failure:
                problems.append((Verdict.FAIL, "ROW_REMAP_FAILED", f"{where(i)}: row remapping failed"))
            if gpu.remap_pending:
                problems.append(
                    (Verdict.FAIL, "ROW_REMAP_PENDING", f"{where(i)}: row remap pending (reset the GPU)")
                )
            if gpu.retired_pages_pending:
                problems.append(
                    (Verdict.FAIL, "RETIRED_PAGES_PENDING", f"{where(i)}: page retirement pending")
                )
            persistence = fields["persistence"].get(str(gpu.bus_id).upper())
            if health["persistence_mode"] and persistence is not None and persistence != "Enabled":
                problems.append(
                    (Verdict.FAIL, "PERSISTENCE_OFF", f"{where(i)}: persistence mode {persistence}")
                )
        critical = set(health["critical_xids"])
        xids = xids_in(log)
        for bus, xid, _line in xids:
            i = index_of_bus.get(bus)
            label = where(i) if i is not None else f"PCI {bus}"
            if xid in critical:
                problems.append(
                    (
                        Verdict.FAIL,
                        "XID_CRITICAL",
                        f"{label}: critical XID {xid} in the last {health['xid_window_hours']:g}h",
                    )
                )
            else:
                problems.append(
                    (
                        Verdict.WARN,
                        "XID_OTHER",
                        f"{label}: XID {xid} in the last {health['xid_window_hours']:g}h",
                    )
                )
        if fabric is not None and fabric[0] is not Verdict.PASS:
            problems.append(
                (
                    fabric[0],
                    "FABRIC_MANAGER_DOWN" if fabric[0] is Verdict.FAIL else "FABRIC_UNKNOWN",
                    fabric[1],
                )
            )

        evidence = {
            "expected": {
                "volatile_uncorrectable": 0,
                "remap_pending": False,
                "critical_xids": sorted(critical),
                "persistence_mode": "Enabled" if health["persistence_mode"] else "any",
                "fabric": "Completed/Success (or nvidia-fabricmanager active)"
                if fabric is not None
                else "n/a",
            },
            "found": {
                "gpus": len(gpus),
                "xids": [{"bus": b, "xid": x, "line": line} for b, x, line in xids][:20],
                "fabric": fabric[1] if fabric is not None else None,
            },
        }
        return [
            self.outcome(
                node, problems, "GPU_HEALTH_OK", f"{len(gpus)} GPUs: no uncorrectable ECC, remaps or XIDs", **evidence
            )
        ]


CHECK = GpuHealth()
