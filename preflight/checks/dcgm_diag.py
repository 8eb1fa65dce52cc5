"""dcgm_diag: ``dcgmi diag -r <level> -j``, every failing DCGM test a FAIL with its ``DCGM_FR_*`` code.

The level is ``--dcgm-level`` when given, else the depth's ``dcgm_level`` (quick 1, standard 2, full 3
in the shipped profiles). The command gets at least ``LEVEL_TIMEOUT_S[level]`` (the documented
durations with headroom), whatever ``--timeout`` says.

Judgement (``evaluate``, pure):

- a test with status Fail -> FAIL, code its first result's ``DCGM_FR_*`` (``DCGM_TEST_FAILED`` when DCGM
  gave none); Warn -> WARN ``DCGM_WARN``;
- DCGM's own known false passes are not trusted: a result that passed while logging an error
  (NVIDIA/DCGM#284: the memory test logs ``DCGM_FR_MEMORY_ALLOC`` and passes) -> FAIL
  ``DCGM_FALSE_PASS``; a run that passed while ``nvidia-smi nvlink -s`` shows inactive links
  (NVIDIA/DCGM#198: level 2 passes with every NVLink down) -> WARN ``DCGM_CROSS_CHECK`` pointing at the
  nvlink check, whose FAIL stands: a DCGM pass never overrides another check's FAIL;
- no host engine (``nv-hostengine`` not running / not reachable) -> ERROR ``DCGM_NO_HOSTENGINE``; no
  ``dcgmi`` (DCGM's package is not installed: no driver or image brings it) -> ERROR ``DCGM_NOT_INSTALLED``;
  never PASS;
- a run that tested nothing is not a pass: no test with status Pass, Fail or Warn (empty
  ``test_categories``, or every test skipped) -> ERROR ``DCGM_NOTHING_RUN``; at level 2 and above, a
  Hardware, Integration or Stress test that did not run (Skip: NVIDIA/DCGM#139 skips PCIe, memory,
  diagnostic and stress at ``-r 3`` and still reports the deployment tests passed) -> WARN
  ``DCGM_SKIPPED`` naming them, FAIL at depth full (the onboarding gate relies on them).

Fault codes: DCGM_FR_* (DCGM's own), DCGM_TEST_FAILED, DCGM_WARN, DCGM_FALSE_PASS, DCGM_CROSS_CHECK,
DCGM_NO_HOSTENGINE, DCGM_NOT_INSTALLED, DCGM_NOTHING_RUN, DCGM_SKIPPED, DCGM_OK.
"""

from __future__ import annotations

from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, GatherError, NodeContext, command_line, excerpt, parse_output
from preflight.checks.nvlink import STATUS
from preflight.parsers.dcgm_diag import DcgmDiag
from preflight.result import CheckResult, Verdict

# dcgmi diag reference: level 1 seconds, level 2 ~2 min, level 3 ~15 min, level 4 longer: x2-x4 headroom.
LEVEL_TIMEOUT_S = {1: 120.0, 2: 600.0, 3: 2400.0, 4: 10800.0}
COMMAND_NOT_FOUND = 127  # the shell's status for a program not on PATH
DCGM_PACKAGE = "datacenter-gpu-manager"  # NVIDIA's DCGM 3 package, the one nvidia_stack installs
_NO_ENGINE = ("host engine", "hostengine", "Unable to establish a connection")
RAN = ("Pass", "Fail", "Warn")  # a test with any other status (Skip, Not Run) tested nothing
# DCGM's test categories that exercise the GPUs (Deployment checks the software stack only).
EXERCISING = ("hardware", "integration", "stress")


def argv(level: int) -> list[str]:
    return ["dcgmi", "diag", "-r", str(level), "-j"]


class DcgmDiagCheck(Check):
    name = "dcgm_diag"
    loads_hardware = True
    codes = {
        "DCGM_TEST_FAILED": "a DCGM test failed without a DCGM_FR_* code (DCGM_FR_* codes are used as printed)",
        "DCGM_WARN": "a DCGM test warned",
        "DCGM_FALSE_PASS": "a DCGM result passed while logging an error (DCGM#284)",
        "DCGM_CROSS_CHECK": "DCGM passed while nvidia-smi shows inactive NVLinks (DCGM#198); see nvlink",
        "DCGM_NO_HOSTENGINE": "dcgmi could not reach nv-hostengine",
        "DCGM_NOT_INSTALLED": "no dcgmi on the host: DCGM's package is not installed",
        "DCGM_NOTHING_RUN": "dcgmi diag ran no test (none listed, or every one skipped): ERROR",
        "DCGM_SKIPPED": "at level >= 2, DCGM skipped a hardware, integration or stress test (WARN; FAIL at depth full)",
    }

    def gather(self, ctx: NodeContext) -> dict[str, Any]:
        depth, settings = ctx.depth()
        level = ctx.options.dcgm_level or settings["dcgm_level"]
        command = argv(level)
        result = ctx.run(command, timeout=max(ctx.options.timeout, LEVEL_TIMEOUT_S.get(level, 600.0)))
        text = result.stdout + "\n" + result.stderr
        if result.timed_out:
            raise GatherError(f"`{command_line(command)}` timed out", command=command_line(command),
                              partial_output=excerpt(result.stdout))
        if "{" not in result.stdout:
            if result.rc == COMMAND_NOT_FOUND:
                raise GatherError(f"no dcgmi on this host: DCGM's package ({DCGM_PACKAGE}) is not installed; "
                                  "provisioning installs it (nvidia_stack)",
                                  code="DCGM_NOT_INSTALLED", command=command_line(command), output=excerpt(text))
            if any(marker in text for marker in _NO_ENGINE):
                raise GatherError(f"dcgmi cannot reach nv-hostengine: {result.last_line()}",
                                  code="DCGM_NO_HOSTENGINE", command=command_line(command), output=excerpt(text))
            raise GatherError(f"`{command_line(command)}` {result.ended()}: {result.last_line()}",
                              command=command_line(command), output=excerpt(text))
        # dcgmi exits non-zero when a test fails and still prints the JSON: judge the JSON.
        diag = parse_output("dcgm-diag", result.stdout, command_line(command))
        try:
            nvlinks = ctx.parsed("nvlink-status", STATUS)
        except GatherError as exc:
            nvlinks = exc.reason  # the cross-check is skipped and says why
        return {"diag": diag, "level": level, "depth": depth, "nvlinks": nvlinks}

    def evaluate(self, facts: dict[str, Any], profile: dict[str, Any], node: Node) -> list[CheckResult]:
        diag: DcgmDiag = facts["diag"]
        level = facts["level"]
        counts = {s: sum(1 for t in diag.tests if t.status == s) for s in ("Pass", "Fail", "Warn", "Skip")}
        evidence = {"level": level, "depth": facts["depth"], "version": diag.version,
                    "found": {"tests": {t.name: t.status for t in diag.tests}}}
        if not any(t.status in RAN for t in diag.tests):
            return [self.result(node, Verdict.ERROR, "DCGM_NOTHING_RUN",
                                f"dcgmi diag -r {level} ran no test ({len(diag.tests)} listed, "
                                f"{counts['Skip']} skipped): nothing was verified", **evidence)]
        problems: list[tuple[Verdict, str, str]] = []
        skipped = [t.name for t in diag.tests if t.status not in RAN and t.category.lower() in EXERCISING]
        if level >= 2 and skipped:
            # Only the deployment (software) tests ran: the GPUs themselves were not exercised.
            strict = facts["depth"] == "full"
            problems.append((Verdict.FAIL if strict else Verdict.WARN, "DCGM_SKIPPED",
                             f"DCGM skipped {', '.join(skipped)} at level {level}: not tested"
                             + (" (depth full needs them)" if strict else "")))
        for test in diag.tests:
            failing = [r for r in test.results if r.status == "Fail"]
            if test.status == "Fail" or failing:
                first = next((e for r in failing or test.results for e in r.errors if e.code), None)
                gpus = ",".join(str(r.gpu) for r in failing if r.gpu is not None)
                detail = f": {first.message[:120]}" if first and first.message else ""
                problems.append((Verdict.FAIL, first.code if first else "DCGM_TEST_FAILED",
                                 f"DCGM {test.name} failed{' on GPU ' + gpus if gpus else ''}{detail}"))
            elif test.status == "Warn":
                problems.append((Verdict.WARN, "DCGM_WARN", f"DCGM {test.name} warned"))
            for result in test.results:
                logged = [e for e in result.errors if e.code and e.code != "DCGM_FR_OK"]
                if result.status == "Pass" and logged:
                    problems.append((Verdict.FAIL, "DCGM_FALSE_PASS",
                                     f"DCGM {test.name} passed on GPU {result.gpu} but logged {logged[0].code} "
                                     f"(NVIDIA/DCGM#284): not trusted"))
        nvlinks = facts["nvlinks"]
        inactive = 0
        if not isinstance(nvlinks, str):
            inactive = sum(1 for g in nvlinks.gpus for link in g.links if not link.active)
            if inactive and not any(v is Verdict.FAIL for v, _, _ in problems):
                problems.append((Verdict.WARN, "DCGM_CROSS_CHECK",
                                 f"DCGM passed while nvidia-smi shows {inactive} inactive NVLinks "
                                 "(NVIDIA/DCGM#198); the nvlink check's verdict stands"))
        ok = f"dcgmi diag -r {level}: {counts['Pass']} tests passed ({counts['Skip']} skipped)"
        evidence["found"]["inactive_nvlinks"] = inactive
        return [self.outcome(node, problems, "DCGM_OK", ok, **evidence,
                             cross_check=nvlinks if isinstance(nvlinks, str) else "nvidia-smi nvlink -s")]


CHECK = DcgmDiagCheck()
