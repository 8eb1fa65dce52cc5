"""gpu_health: memory errors, XIDs, persistence mode and (on NVSwitch boards) the fabric manager.

``gather`` runs ``nvidia-smi -q`` (NVML's view, read on the host: NVML cannot be asked remotely; parsed
by the one ``nvsmi-q`` parser), the kernel log of the last ``health.xid_window_hours`` (``journalctl
-k --grep 'NVRM: Xid'``: only the XID lines leave the host; falling back to ``dmesg`` when journalctl cannot
read the system journal, as when the connecting user is in neither systemd-journal nor adm; kind ``kernel-xids``) and, on NVSwitch boards whose GPUs do not print
their own fabric state, ``systemctl is-active nvidia-fabricmanager`` (kind ``systemctl-is-active``). ``evaluate`` (pure) judges: Volatile uncorrectable ECC > 0, a pending or
failed row remap, pending page retirement, a critical XID (the azurehpc-health-checks list) or an
untrained NVSwitch fabric -> FAIL; any other XID -> WARN; persistence mode off where the profile
requires it -> FAIL.

Fault codes: ECC_UNCORRECTABLE, ROW_REMAP_PENDING, ROW_REMAP_FAILED, RETIRED_PAGES_PENDING, XID_CRITICAL,
XID_OTHER, PERSISTENCE_OFF, FABRIC_MANAGER_DOWN, FABRIC_UNKNOWN, GPU_HEALTH_OK.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, GatherError, NodeContext, command_line, excerpt, parse_output
from preflight.parsers.kernel_log import KernelXids, journal_gap, no_entries, short_bus
from preflight.parsers.nvsmi_q import NvsmiReport
from preflight.result import CheckResult, Verdict

NVSMI_Q = ["nvidia-smi", "-q"]
FABRIC_MANAGER = ["systemctl", "is-active", "nvidia-fabricmanager"]
SYSTEMD_STATES = ("inactive", "failed", "activating", "deactivating", "reloading", "unknown", "maintenance")


@dataclass(frozen=True)
class FabricUnit:
    """What ``systemctl is-active nvidia-fabricmanager`` answered: its state word and its last line."""

    state: str
    last_line: str


@dataclass(frozen=True)
class GpuHealthFacts:
    report: NvsmiReport
    xids: KernelXids
    fabric_unit: FabricUnit | None  # asked only on NVSwitch boards whose GPUs print no Fabric state


XID_PATTERN = "NVRM: Xid"  # what kernel_log's _XID needs in a line; journalctl matches it case-sensitively
JOURNAL_NO_MATCH_RC = 1  # `journalctl --grep` exits 1 when nothing matched, as grep(1) does (systemd journalctl.c)


def kernel_log_argv(hours: float) -> list[str]:
    """The window's kernel log, filtered on the host to the driver's XID lines (an XID or
    error storm makes the whole log hundreds of MB per node): the kernel-xids parser counts only those
    lines, and journalctl's stamps on them are unchanged. Not ``-q``: that silences journalctl's hint that
    the user cannot see the system's messages, and an unreadable journal read as no XID."""
    return ["journalctl", "-k", "--no-pager", "--since", f"-{hours:g}h", "--grep", XID_PATTERN]


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

    def gather(self, ctx: NodeContext) -> GpuHealthFacts:
        text = ctx.output(NVSMI_Q)
        report = parse_output("nvsmi-q", text, command_line(NVSMI_Q))
        if report.attached is not None and len(report.gpus) < report.attached:
            # The parser takes one whole block as `-q -i N`; here every GPU was asked for.
            raise GatherError(f"`nvidia-smi -q` printed {len(report.gpus)} of {report.attached} attached GPUs",
                              command="nvidia-smi -q", output=excerpt(text))
        xids = self._kernel_log(ctx)
        fabric_unit = None
        if ctx.profile["gpu"]["nvswitch"] and not _fabric_of(report):
            unit = ctx.run(FABRIC_MANAGER)
            # Its exit status is 3 for every state but active, so stdout decides; no stdout at all (no
            # systemd, no bus: the reason is on stderr) is "cannot tell", a stdout that is no state an ERROR.
            state = ""
            if unit.stdout.strip():
                states = parse_output("systemctl-is-active", unit.stdout, command_line(FABRIC_MANAGER)).states
                if len(states) != 1:
                    raise GatherError(f"`{command_line(FABRIC_MANAGER)}` printed {len(states)} states for one unit",
                                      command=command_line(FABRIC_MANAGER), output=excerpt(unit.stdout))
                state = states[0]
            fabric_unit = FabricUnit(state, unit.last_line())
        return GpuHealthFacts(report, xids, fabric_unit)

    def _kernel_log(self, ctx: NodeContext) -> KernelXids:
        argv = kernel_log_argv(ctx.profile["health"]["xid_window_hours"])
        result = ctx.run(argv)
        gap = journal_gap(result.stderr)  # the connecting user does not see the system journal, or there is none
        # --grep matched nothing: exit 1, as grep(1), with only `-- No entries --` on stdout
        no_match = result.rc == JOURNAL_NO_MATCH_RC and not result.stderr.strip() and no_entries(result.stdout)
        if gap or not (result.ok or no_match):
            # no journal we can read: the ring buffer, i.e. this boot
            journal, argv = argv, ["dmesg"]
            try:
                text = ctx.output(argv)
            except GatherError as exc:
                why = gap or result.last_line()
                raise GatherError(f"kernel log unreadable: `{command_line(journal)}`: {why}; {exc.reason}",
                                  **exc.evidence) from None
        else:
            text = result.stdout
        if no_entries(text):
            return KernelXids([], 0)
        return parse_output("kernel-xids", text, command_line(argv))

    def evaluate(self, facts: GpuHealthFacts, profile: dict[str, Any], node: Node) -> list[CheckResult]:
        health = profile["health"]
        gpus = facts.report.gpus
        fabric = _fabric_verdict(facts) if profile["gpu"]["nvswitch"] else None
        index_of_bus = {short_bus(g.bus_id): i for i, g in enumerate(gpus)}
        iu_of_gpu = {g: iu.id for iu in node.ius for g in iu.gpus}

        def where(i: int) -> str:
            return f"GPU{i}" + (f" ({iu_of_gpu[i]})" if i in iu_of_gpu else "")

        problems: list[tuple[Verdict, str, str]] = []
        for i, gpu in enumerate(gpus):
            if (gpu.volatile_uncorrectable or 0) > 0:
                problems.append((Verdict.FAIL, "ECC_UNCORRECTABLE",
                                 f"{where(i)}: {gpu.volatile_uncorrectable} volatile uncorrectable ECC errors"))
            if gpu.remap_failure:
                problems.append((Verdict.FAIL, "ROW_REMAP_FAILED", f"{where(i)}: row remapping failed"))
            if gpu.remap_pending:
                problems.append((Verdict.FAIL, "ROW_REMAP_PENDING", f"{where(i)}: row remap pending (reset the GPU)"))
            if gpu.retired_pages_pending:
                problems.append((Verdict.FAIL, "RETIRED_PAGES_PENDING", f"{where(i)}: page retirement pending"))
            persistence = gpu.persistence_mode
            if health["persistence_mode"] and persistence is not None and persistence != "Enabled":
                problems.append((Verdict.FAIL, "PERSISTENCE_OFF", f"{where(i)}: persistence mode {persistence}"))
        critical = set(health["critical_xids"])
        window = f"{health['xid_window_hours']:g}h"
        for event in facts.xids.xids:
            i = index_of_bus.get(event.bus)
            label = where(i) if i is not None else f"PCI {event.bus}"
            if event.xid in critical:
                problems.append((Verdict.FAIL, "XID_CRITICAL", f"{label}: critical XID {event.xid} in the last {window}"))
            else:
                problems.append((Verdict.WARN, "XID_OTHER", f"{label}: XID {event.xid} in the last {window}"))
        if fabric is not None and fabric[0] is not Verdict.PASS:
            code = "FABRIC_MANAGER_DOWN" if fabric[0] is Verdict.FAIL else "FABRIC_UNKNOWN"
            problems.append((fabric[0], code, fabric[1]))

        evidence = {
            "expected": {
                "volatile_uncorrectable": 0,
                "remap_pending": False,
                "critical_xids": sorted(critical),
                "persistence_mode": "Enabled" if health["persistence_mode"] else "any",
                "fabric": "Completed/Success (or nvidia-fabricmanager active)" if fabric is not None else "n/a",
            },
            "found": {
                "gpus": len(gpus),
                "xids": [{"bus": e.bus, "xid": e.xid, "line": e.text} for e in facts.xids.xids][:20],
                "fabric": fabric[1] if fabric is not None else None,
            },
        }
        return [self.outcome(node, problems, "GPU_HEALTH_OK",
                             f"{len(gpus)} GPUs: no uncorrectable ECC, remaps or XIDs", **evidence)]


def _fabric_of(report: NvsmiReport) -> dict[str, tuple[str | None, str | None]]:
    """Bus id -> (Fabric State, Status) of the GPUs that print their fabric (drivers >= R530 on NVSwitch
    boards): the effective registration the fabric manager performs, not whether a unit is running."""
    return {g.bus_id.upper(): (g.fabric_state, g.fabric_status) for g in report.gpus
            if g.fabric_state is not None or g.fabric_status is not None}


def _fabric_verdict(facts: GpuHealthFacts) -> tuple[Verdict, str]:
    """NVSwitch fabric: the GPUs' Fabric State (R530+), else the fabric manager unit's state."""
    fabric = _fabric_of(facts.report)
    if fabric:
        bad = {bus: f"{state}/{status}" for bus, (state, status) in fabric.items()
               if (state, status) != ("Completed", "Success")}
        if bad:
            bus, state = next(iter(bad.items()))
            return Verdict.FAIL, (f"NVSwitch fabric not trained on {len(bad)} GPUs (GPU {bus}: {state}); "
                                  "is nvidia-fabricmanager running?")
        return Verdict.PASS, f"fabric Completed/Success on {len(fabric)} GPUs"
    unit = facts.fabric_unit
    if unit is None:
        return Verdict.WARN, "cannot tell whether nvidia-fabricmanager runs: not asked"
    if unit.state == "active":
        return Verdict.PASS, "nvidia-fabricmanager active"
    if unit.state in SYSTEMD_STATES:
        return Verdict.FAIL, f"nvidia-fabricmanager is {unit.state} (NVSwitch board)"
    return Verdict.WARN, f"cannot tell whether nvidia-fabricmanager runs: {unit.last_line or 'no output'}"


CHECK = GpuHealth()
