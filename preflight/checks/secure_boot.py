"""secure_boot: under Secure Boot the NVIDIA module must be loaded, else the kernel refused its key.

``gather``: ``mokutil --sb-state`` (kind ``mokutil-sb-state``; stderr too, where mokutil says a host has no
Secure Boot; a host without mokutil has none to report and counts as not enforcing) and the loaded NVIDIA
module's version (``/sys/module/nvidia/version``, absent when none is loaded); ``evaluate`` (pure) judges them.

With Secure Boot enforcing module signatures, the kernel loads only modules signed by a key it trusts. DKMS
signs the module it builds with the host's own key (``/var/lib/dkms/mok.pub``), trusted only once enrolled in
the MOK list through MokManager at the console; until then every boot refuses the module ("Key was rejected by
service": kernel/module/signing.c ``module_sig_check``, EKEYREJECTED) and the GPUs have no driver. The other
checks then fail on "couldn't communicate with the NVIDIA driver"; this one names the cause and the fix.

Fault codes: SECURE_BOOT_MODULE_REFUSED, SECURE_BOOT_OK.
"""

from __future__ import annotations

from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, NodeContext, parse_output
from preflight.parsers.secure_boot import SecureBootState
from preflight.result import CheckResult, Verdict

SB_STATE = ["mokutil", "--sb-state"]
LOADED_MODULE = ["cat", "/sys/module/nvidia/version"]
COMMAND_NOT_FOUND = 127


class SecureBoot(Check):
    name = "secure_boot"
    codes = {"SECURE_BOOT_MODULE_REFUSED": "Secure Boot enforces module signatures and no NVIDIA module is loaded"}

    def gather(self, ctx: NodeContext) -> dict[str, Any]:
        answer = ctx.run(SB_STATE)
        state = None
        if answer.rc != COMMAND_NOT_FOUND:
            state = parse_output("mokutil-sb-state", (answer.stdout + "\n" + answer.stderr).strip(), "mokutil --sb-state")
        module = ctx.run(LOADED_MODULE)
        return {"state": state, "loaded": module.stdout.strip() if module.ok else None}

    def evaluate(self, facts: dict[str, Any], profile: dict[str, Any], node: Node) -> list[CheckResult]:
        state: SecureBootState | None = facts["state"]
        loaded: str | None = facts["loaded"] or None
        evidence = {"expected": {"nvidia_module": "loaded when Secure Boot enforces module signatures"},
                    "found": {"secure_boot": state.to_json() if state else None, "nvidia_module": loaded}}
        if state is not None and state.enforcing and loaded is None:
            return [self.result(
                node, Verdict.FAIL, "SECURE_BOOT_MODULE_REFUSED",
                "Secure Boot is enabled and no NVIDIA module is loaded: the kernel refuses a module signed by a key it "
                "does not trust (\"Key was rejected by service\"); enroll the DKMS key with `mokutil --import "
                "/var/lib/dkms/mok.pub` and confirm it in MokManager on the console at the next boot",
                **evidence)]
        said = "no mokutil" if state is None else f"Secure Boot {state.secure_boot}"
        if state is not None and state.secure_boot == "enabled" and not state.enforcing:
            said += " (shim validation off)"
        return [self.result(node, Verdict.PASS, "SECURE_BOOT_OK",
                            f"{said}, NVIDIA module {loaded or 'not loaded'}", **evidence)]


CHECK = SecureBoot()
