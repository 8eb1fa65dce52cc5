"""Parser for ``mokutil --sb-state`` (stdout and stderr together): the firmware's Secure Boot state.

Usage::

    from preflight.parsers import secure_boot
    state = secure_boot.parse(text)
    state.secure_boot, state.enforcing          # ('enabled', True)

Schema (``SecureBootState.to_json()``, kind ``mokutil-sb-state``)::

    {"secure_boot": "enabled", "shim_validation": true, "setup_mode": false, "enforcing": true}

The lines are mokutil's own (``src/mokutil.c``, ``print_sb_state`` and its callers): ``SecureBoot enabled`` or
``SecureBoot disabled`` (the firmware's ``SecureBoot`` variable); ``SecureBoot validation is disabled in shim``
when shim's ``MokSBStateRT`` is set (``mokutil --disable-validation``: shim boots anything and the kernel does not
enforce module signatures); ``Platform is in Setup Mode``; and, where there is no Secure Boot at all,
``EFI variables are not supported on this system`` (a legacy BIOS boot) or ``This system doesn't support Secure
Boot`` (no ``SecureBoot`` variable): ``secure_boot`` is then ``unsupported``. ``enforcing``: the kernel rejects
modules that are unsigned or signed by a key it does not trust ("Key was rejected by service").

Strict: any other line (a shell's "command not found", a cut word) is a ParseError naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from preflight.parsers.common import ParseError, first_nonblank, is_prompt, lines

_STATES = {"SecureBoot enabled": "enabled", "SecureBoot disabled": "disabled",
           "EFI variables are not supported on this system": "unsupported",
           "This system doesn't support Secure Boot": "unsupported"}
_SHIM_OFF = "SecureBoot validation is disabled in shim"
_SETUP_MODE = "Platform is in Setup Mode"


@dataclass(frozen=True)
class SecureBootState:
    secure_boot: str  # enabled | disabled | unsupported
    shim_validation: bool
    setup_mode: bool

    @property
    def enforcing(self) -> bool:
        return self.secure_boot == "enabled" and self.shim_validation

    def to_json(self) -> dict:
        return {"secure_boot": self.secure_boot, "shim_validation": self.shim_validation,
                "setup_mode": self.setup_mode, "enforcing": self.enforcing}


def parse(text: str) -> SecureBootState:
    all_lines = lines(text)
    content = [line for line in all_lines if line.text.strip() and not is_prompt(line.text.strip())]
    if not content:
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, "no Secure Boot state (a line such as 'SecureBoot enabled')")
    state, shim_validation, setup_mode = None, True, False
    for line in content:
        said = line.text.strip()
        if said in _STATES and state is None:
            state = _STATES[said]
        elif said == _SHIM_OFF and state == "enabled":
            shim_validation = False
        elif said == _SETUP_MODE and state in ("enabled", "disabled"):
            setup_mode = True
        else:
            raise ParseError(line.no, line.text, "not a line mokutil --sb-state prints here")
    return SecureBootState(state, shim_validation, setup_mode)
