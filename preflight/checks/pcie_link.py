"""pcie_link: every GPU's and HCA's PCIe link trained at the generation and width the SKU profile expects.

Gathers ``nvidia-smi -q -d PCI,PERFORMANCE`` (GPUs) and, in one ``grep -H``, the sysfs
``current_link_speed``/``current_link_width``/``max_link_speed``/``max_link_width`` of each inventory HCA.

An idle GPU lowers its link to Gen1 to save power (the width stays), so a GPU that reads below the
expected generation while idle is read again under load: ``nvbandwidth -t host_to_device_memcpy_ce`` runs
in the background for ``LOAD_SETTLE_S`` and the PCI display is read while it copies. Only that reading
can FAIL the generation; when no load could be started the verdict is WARN ``PCIE_GEN_UNVERIFIED``.

Judgement (``evaluate``, pure): width below the profile's (or below the device's own max) -> FAIL
``PCIE_WIDTH``; generation (under load) below the profile's (or below the link's own ``Max``) -> FAIL
``PCIE_GEN``; a slot whose host side cannot do the profile's generation (``Host Max``) -> FAIL
``PCIE_SLOT``; nvidia-smi listing fewer GPUs than the node has -> FAIL ``PCIE_MISSING`` naming them.

Fault codes: PCIE_WIDTH, PCIE_GEN, PCIE_SLOT, PCIE_GEN_UNVERIFIED, PCIE_MISSING, PCIE_OK.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, GatherError, NodeContext, command_line, gpus_short, parse_output
from preflight.checks.gpu_throttle import gpu_label
from preflight.parsers.ib_health import PCIE_LINK_FILES, PcieLinkState, SysfsValues, pcie_link
from preflight.parsers.nvsmi_sections import PcieReport
from preflight.result import CheckResult, Verdict

NVSMI_PCI = ["nvidia-smi", "-q", "-d", "PCI,PERFORMANCE"]
LOAD = ["nvbandwidth", "-t", "host_to_device_memcpy_ce", "-i", "20"]
LOAD_SETTLE_S = 2.0  # the link retrains to full speed within milliseconds of the first copy
HCA_FILES = PCIE_LINK_FILES


@dataclass(frozen=True)
class PcieFacts:
    idle: PcieReport
    loaded: PcieReport | None  # the re-read under load, when some GPU read low while idle
    load_error: str | None  # why no loaded reading could be taken
    hcas: dict[str, PcieLinkState | None]  # device -> its link, typed from sysfs (None: no attribute read)


def gen_floor(profile_gen: int, own_max: int | None) -> int:
    """The generation a link must train at: the profile's, or the device's own maximum when that is higher
    (as for the width; a slot that cannot do the profile's is PCIE_SLOT)."""
    return max(profile_gen, own_max or 0)


def hca_dir(device: str) -> str:
    return f"/sys/class/infiniband/{device}/device"


def hca_paths(device: str) -> list[str]:
    return [f"{hca_dir(device)}/{name}" for name in HCA_FILES]


class PcieLink(Check):
    name = "pcie_link"
    loads_hardware = True  # reads the generation under an nvbandwidth copy
    codes = {
        "PCIE_WIDTH": "a GPU or HCA link trained narrower than the profile or its own maximum",
        "PCIE_GEN": "a GPU (under load) or HCA link below the profile's PCIe generation",
        "PCIE_SLOT": "the host side of the slot cannot run the profile's generation",
        "PCIE_GEN_UNVERIFIED": "an idle GPU read low and no load could be started to re-read it (WARN)",
        "PCIE_MISSING": "an inventory HCA has no PCIe attributes in sysfs, or nvidia-smi lists fewer GPUs than the node",
    }

    def gather(self, ctx: NodeContext) -> PcieFacts:
        idle = ctx.parsed("nvsmi-pci", NVSMI_PCI)
        expected = ctx.profile["pcie"]["gpu_gen"]
        loaded, load_error = None, None
        if any(g.gen_current is not None and g.gen_current < gen_floor(expected, g.gen_max) for g in idle.gpus):
            loaded, load_error = self._under_load(ctx)
        hcas: dict[str, PcieLinkState | None] = {}
        if ctx.node.nics:
            paths = [p for nic in ctx.node.nics for p in hca_paths(nic.device)]
            argv = ["grep", "-H", ".", *paths]
            result = ctx.run(argv)
            # grep exits 2 when a file is missing and still prints the others: judge what came back. Any other
            # failure (no grep, a timeout) says nothing about the HCAs and is an ERROR.
            missing_only = result.rc == 2 and "No such file" in result.stderr
            if result.timed_out or (result.rc != 0 and not missing_only):
                raise GatherError(f"`grep -H . <HCA link files>` {result.ended()}: {result.last_line()}",
                                  command=command_line(argv), stderr=result.stderr[:400])
            values = parse_output("sysfs", result.stdout, "grep -H . <hca link files>") if result.stdout.strip() else None
            for nic in ctx.node.nics:
                mine = {p: values.values[p] for p in hca_paths(nic.device) if values and p in values.values}
                hcas[nic.device] = pcie_link(SysfsValues(mine), hca_dir(nic.device)) if mine else None
        return PcieFacts(idle, loaded, load_error, hcas)

    def _under_load(self, ctx: NodeContext) -> tuple[PcieReport | None, str | None]:
        try:
            server = ctx.transport.start(ctx.node, LOAD, ctx.options.timeout)
        except Exception as exc:  # no nvbandwidth, or the transport cannot start it
            return None, f"cannot start `{command_line(LOAD)}`: {exc}"
        try:
            time.sleep(LOAD_SETTLE_S)
            return ctx.parsed("nvsmi-pci", NVSMI_PCI, cache=False), None
        except GatherError as exc:
            return None, exc.reason
        finally:
            server.stop()

    def evaluate(self, facts: PcieFacts, profile: dict[str, Any], node: Node) -> list[CheckResult]:
        cfg = profile["pcie"]
        problems: list[tuple[Verdict, str, str]] = []
        found: dict[str, Any] = {}
        loaded = {g.bus_id: g for g in facts.loaded.gpus} if facts.loaded else {}
        for index, gpu in enumerate(facts.idle.gpus):
            under_load = loaded.get(gpu.bus_id)
            reading = under_load or gpu
            name = gpu_label(index, gpu.bus_id)
            found[name] = {"gen": reading.gen_current, "gen_max": gpu.gen_max, "host_max": gpu.gen_host_max,
                           "width": gpu.width_current, "width_max": gpu.width_max,
                           "read_under_load": under_load is not None}
            width_floor = max(cfg["gpu_width"], gpu.width_max or 0)
            if gpu.width_current is not None and gpu.width_current < width_floor:
                problems.append((Verdict.FAIL, "PCIE_WIDTH", f"{name} at x{gpu.width_current}, expected x{width_floor}"))
            if gpu.gen_host_max is not None and gpu.gen_host_max < cfg["gpu_gen"]:
                problems.append((Verdict.FAIL, "PCIE_SLOT",
                                 f"{name}: slot (host side) max Gen{gpu.gen_host_max} < Gen{cfg['gpu_gen']}"))
            elif (reading.gen_current is not None
                  and reading.gen_current < (floor := gen_floor(cfg["gpu_gen"], gpu.gen_max))):
                if under_load is None and gpu.idle is not False:  # idle or unknown: not a loaded reading
                    problems.append((Verdict.WARN, "PCIE_GEN_UNVERIFIED",
                                     f"{name} at Gen{gpu.gen_current} while idle and not re-read under load: "
                                     f"{facts.load_error or 'no loaded reading'}"))
                else:
                    own = f" (its max; profile Gen{cfg['gpu_gen']})" if floor > cfg["gpu_gen"] else ""
                    problems.append((Verdict.FAIL, "PCIE_GEN", f"{name} at Gen{reading.gen_current} under load, "
                                                               f"expected Gen{floor}{own}"))
        if short := gpus_short("nvidia-smi -q -d PCI", range(len(facts.idle.gpus)), node.gpu_count):
            problems.append((Verdict.FAIL, "PCIE_MISSING", short))
        for device, hca in facts.hcas.items():
            if hca is None:
                problems.append((Verdict.FAIL, "PCIE_MISSING", f"HCA {device}: no PCIe link attributes in sysfs"))
                continue
            gen, gen_max, width, width_max = hca.gen, hca.gen_max, hca.width, hca.width_max
            found[f"HCA {device}"] = {"gen": gen, "gen_max": gen_max, "width": width, "width_max": width_max}
            width_floor = max(cfg["hca_width"], width_max or 0)
            if width is not None and width < width_floor:
                problems.append((Verdict.FAIL, "PCIE_WIDTH", f"HCA {device} at x{width}, expected x{width_floor}"))
            floor = gen_floor(cfg["hca_gen"], gen_max)
            if gen is not None and gen < floor:
                problems.append((Verdict.FAIL, "PCIE_GEN", f"HCA {device} at Gen{gen}, expected Gen{floor}"))
        expected = {"gpu": f"Gen{cfg['gpu_gen']} x{cfg['gpu_width']}", "hca": f"Gen{cfg['hca_gen']} x{cfg['hca_width']}"}
        ok = f"{len(facts.idle.gpus)} GPUs and {len(facts.hcas)} HCAs at Gen{cfg['gpu_gen']}/x{cfg['gpu_width']} or better"
        return [self.outcome(node, problems, "PCIE_OK", ok, expected=expected, found=found)]


CHECK = PcieLink()
