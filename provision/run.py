"""The ansible-runner driver behind ``clusterctl provision``: run a :class:`Plan`'s playbook in this process.

:func:`run_playbook` starts ``ansible-playbook`` through ``ansible_runner.run(event_handler=...)`` with
the plan's inventory, limit, tags and batches; every event goes first to a :class:`Rollout` and then,
flushed, to ``<run dir>/events.jsonl`` (0600, in a 0700 run dir). ``on_event(rollout)`` runs after
each event: the CLI redraws its live view or prints the rollout's new notices there. Nothing here
prints; the caller decides how a run looks.

``vault_password_file`` goes to ansible-playbook as its own ``--vault-password-file``: only the path
is on the command line, never the password.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.plan import REPO_ROOT, Plan
from provision.rollout import Rollout


@dataclass
class RunResult:
    rollout: Rollout
    rc: int  # ansible-playbook's exit status (1 when the runner reported none)
    events_error: str | None  # why events.jsonl is incomplete (a failed write), or None

    def succeeded(self) -> bool:
        return self.rollout.succeeded(self.rc)


def run_playbook(
    plan: Plan, run_dir: Path, *, check: bool = False, diff: bool = False, forks: int | None = None,
    vault_password_file: Path | None = None, allow_reboot: bool = False,
    on_event: Callable[[Rollout], None] | None = None, extravars: Mapping[str, Any] | None = None,
) -> RunResult:
    """``extravars``: more ``-e`` variables (a caller's own, such as the reboot reason), beside the batches and
    ``clusterctl_allow_reboot``, which they cannot replace."""
    import ansible_runner  # heavy (imports ansible): only when a playbook runs

    run_dir = prepare_run_dir(run_dir)  # 0700; events.jsonl 0600 (they carry task results)
    rollout = Rollout(plan)
    with EventLog(run_dir / "events.jsonl") as events:

        def handler(event: dict[str, Any]) -> bool:
            rollout.handle(event)  # first: a full disk must not cost the recap its record of the host
            events.write(event)  # flushed per event: `tail -f events.jsonl` follows the run
            if on_event is not None:
                on_event(rollout)
            rollout.notices.clear()
            return False  # events.jsonl has them: no second copy as one artifact file per event

        result = ansible_runner.run(
            private_data_dir=str(run_dir / "runner"),
            project_dir=str(plan.playbook.parent),
            playbook=plan.playbook.name,
            inventory=str(plan.inventory),
            limit=plan.limit,
            tags=",".join(plan.tags) or None,
            forks=forks,
            cmdline=playbook_args(check=check, diff=diff, vault_password_file=vault_password_file) or None,
            extravars={**(extravars or {}), "clusterctl_batches": list(plan.batch_sizes),
                       "clusterctl_allow_reboot": allow_reboot},
            envvars=runner_env(),
            event_handler=handler,
            quiet=True,
            suppress_env_files=True,
        )
    return RunResult(rollout, int(result.rc if result.rc is not None else 1), events.error)


def playbook_args(*, check: bool, diff: bool, vault_password_file: Path | None) -> str:
    """The extra ansible-playbook arguments, as one shell-quoted string (ansible-runner's ``cmdline``)."""
    args = [flag for flag, on in (("--check", check), ("--diff", diff)) if on]
    if vault_password_file:
        # ansible-playbook's own --vault-password-file (absolute path; the runner's cwd is the project
        # dir) rather than ANSIBLE_VAULT_PASSWORD_FILE in envvars: it is explicit in the runner's recorded
        # command, and Ansible adds it to an ANSIBLE_VAULT_PASSWORD_FILE the operator already exports
        # instead of silently replacing it. Only the path is on the command line; ansible-playbook reads
        # the file (or runs the script) itself.
        args += ["--vault-password-file", str(vault_password_file)]
    return shlex.join(args)


def runner_env() -> dict[str, str]:
    return {
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "ANSIBLE_FORCE_COLOR": "0",
        # ansible-runner starts `ansible-playbook` from PATH: the one next to this interpreter (the venv)
        "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))),
        # the filter plugin imports the cluster model from this checkout
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
        # ansible-runner sets ANSIBLE_HOST_KEY_CHECKING=False unless it is given, which overrides
        # ansible.cfg and makes Ansible pass -o StrictHostKeyChecking=no ahead of the inventory's own
        # options (ssh takes the first): an unknown or changed host key must stop the run instead.
        "ANSIBLE_HOST_KEY_CHECKING": "True",
    }


def run_dir_problem(run_dir: Path, inventory: Path) -> str | None:
    """Why ``run_dir`` cannot hold this run's files, or None. Ansible reads every file under an inventory
    directory as inventory, except names starting with a dot (and group_vars, host_vars): a run dir inside it
    would have the next run parse the runner's artifacts (its env and command files) as inventory sources."""
    inventory, run_dir = Path(inventory).resolve(), Path(run_dir).resolve()
    if not inventory.is_dir() or not run_dir.is_relative_to(inventory):
        return None
    inside = run_dir.relative_to(inventory).parts
    if any(part.startswith(".") or part in ("group_vars", "host_vars") for part in inside):
        return None
    return (f"--run-dir {run_dir} is inside the inventory directory {inventory}: Ansible would read the run's "
            f"files as inventory; choose a directory outside it, or one whose name starts with a dot")


# events.jsonl and the runner's artifacts carry task results (a rendered env file, a diff): private to the
# operator, as ansible-runner keeps its own event files.
def prepare_run_dir(run_dir: Path) -> Path:
    """``run_dir`` and ``run_dir/runner``, created (or tightened) 0700; returns the resolved path."""
    run_dir = Path(run_dir).resolve()
    for directory in (run_dir, run_dir / "runner"):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
    return run_dir


class EventLog:
    """Appends events to ``<run dir>/events.jsonl`` (0600). A failed write (ENOSPC) never stops the run
    or the rollout's bookkeeping: it is remembered in ``error`` for the recap, and later writes are skipped."""

    def __init__(self, path: Path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # an existing file from an earlier run is tightened too
        self.file = os.fdopen(fd, "a")
        self.path = path
        self.error: str | None = None

    def write(self, event: Mapping[str, Any]) -> None:
        if self.error is not None:
            return
        try:
            self.file.write(json.dumps(event, default=str) + "\n")
            self.file.flush()
        except OSError as exc:
            self.error = f"{self.path}: {exc.strerror or exc}; later events were not recorded"

    def close(self) -> None:
        try:
            self.file.close()
        except OSError as exc:
            self.error = self.error or f"{self.path}: {exc.strerror or exc}"

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
