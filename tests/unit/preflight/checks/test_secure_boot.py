"""preflight/checks/secure_boot.py: ``evaluate`` on mokutil states of real outputs with and without a loaded NVIDIA
module (only an enforcing Secure Boot without a module fails, naming the enrollment), ``gather`` through a scripted
transport (mokutil's stderr read too; no mokutil is no Secure Boot; an unreadable answer is an ERROR)."""

from __future__ import annotations

import pytest

from preflight.checks import secure_boot
from preflight.profiles import profile_of
from preflight.result import Verdict
from preflight.transport import CommandResult
from tests.helpers.preflight import ScriptedTransport, context, node
from tests.helpers.preflight_checks import parsed

pytestmark = pytest.mark.unit

N = node()


def judged(fixture: str | None, loaded: str | None):
    state = parsed("mokutil-sb-state", fixture) if fixture else None
    [result] = secure_boot.CHECK.evaluate({"state": state, "loaded": loaded}, profile_of(N), N)
    return result


def test_secure_boot_without_a_loaded_module_fails_naming_the_enrollment():
    result = judged("enabled.txt", None)
    assert (result.verdict, result.code) == (Verdict.FAIL, "SECURE_BOOT_MODULE_REFUSED")
    assert "Key was rejected by service" in result.reason and "mokutil --import /var/lib/dkms/mok.pub" in result.reason


@pytest.mark.parametrize("fixture, loaded, reason", [
    ("enabled.txt", "550.127.08", "Secure Boot enabled, NVIDIA module 550.127.08"),  # its key is trusted
    ("disabled.txt", None, "Secure Boot disabled, NVIDIA module not loaded"),
    ("legacy-bios-no-efi-variables.txt", None, "Secure Boot unsupported, NVIDIA module not loaded"),
    ("enabled-shim-validation-disabled.txt", None,
     "Secure Boot enabled (shim validation off), NVIDIA module not loaded"),  # the kernel does not enforce
    (None, None, "no mokutil, NVIDIA module not loaded"),
])
def test_no_refused_module_passes(fixture, loaded, reason):
    result = judged(fixture, loaded)
    assert (result.verdict, result.code, result.reason) == (Verdict.PASS, "SECURE_BOOT_OK", reason)


def test_gather_reads_mokutil_stderr_and_the_loaded_module():
    no_efi = CommandResult(1, "", "EFI variables are not supported on this system\n", 0.0)
    t = (ScriptedTransport().on("n1", "mokutil", "--sb-state", reply=no_efi)
         .on("n1", "cat", "/sys/module/nvidia/version", reply=(1, "")))
    [result] = secure_boot.CHECK.run(context(t))
    assert (result.verdict, result.reason) == (Verdict.PASS, "Secure Boot unsupported, NVIDIA module not loaded")


def test_a_host_under_secure_boot_with_no_module_fails_through_gather():
    t = (ScriptedTransport().on("n1", "mokutil", "--sb-state", reply="SecureBoot enabled\n")
         .on("n1", "cat", "/sys/module/nvidia/version", reply=(1, "")))
    [result] = secure_boot.CHECK.run(context(t))
    assert result.code == "SECURE_BOOT_MODULE_REFUSED"


def test_an_unreadable_answer_is_an_error():
    t = ScriptedTransport().on("n1", "mokutil", "--sb-state", reply="Segmentation fault\n")
    [result] = secure_boot.CHECK.run(context(t))
    assert result.verdict is Verdict.ERROR
