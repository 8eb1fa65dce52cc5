"""Processes a command starts and must stop: tracked by PID, stopped with SIGTERM then SIGKILL.

Each child runs in its own process group so that stopping it also stops what it spawned (an ssh
client's children, for example), and nothing outlives the command that started it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Managed:
    name: str
    process: subprocess.Popen
    log: Path


class ProcessSet:
    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.children: list[Managed] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Managed:
        log = self.log_dir / f"{name}.log"
        with open(log, "ab") as out:
            process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        child = Managed(name, process, log)
        self.children.append(child)
        return child

    def failed(self) -> list[Managed]:
        """Children that already exited (they are all meant to run until stopped)."""
        return [c for c in self.children if c.process.poll() is not None]

    def stop(self, names: set[str] | None = None, grace_s: float = 5.0) -> None:
        chosen = [c for c in self.children if names is None or c.name in names]
        for child in chosen:
            _signal_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in chosen:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(child.process, signal.SIGKILL)
                child.process.wait()
            # the group may still hold grandchildren after the leader exited
            _signal_group(child.process, signal.SIGKILL)
        self.children = [c for c in self.children if c not in chosen]


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
