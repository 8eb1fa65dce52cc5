"""Helpers for preflight check/runner tests (imported by the test modules; conftest.py declares no
fixtures for them): a scripted transport, nodes built from host variables, fixture texts, and a
virtual-inventory builder for the simulated-host tests."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import yaml

from cluster.model import build_node
from preflight.checks.base import NodeContext, RunOptions
from preflight.profiles import profile_of
from preflight.transport import CommandResult

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "preflight"

H100_NICS = [
    {
        "device": "mlx5_0",
        "netdev": "ibp26s0",
        "link_layer": "infiniband",
        "rate_gbps": 400,
        "numa_node": 0,
        "gpu": 0,
    },
    {
        "device": "mlx5_1",
        "netdev": "ibp60s0",
        "link_layer": "infiniband",
        "rate_gbps": 400,
        "numa_node": 0,
        "gpu": 2,
    },
    {
        "device": "mlx5_2",
        "netdev": "ibp156s0",
        "link_layer": "infiniband",
        "rate_gbps": 400,
        "numa_node": 1,
        "gpu": 4,
    },
    {
        "device": "mlx5_3",
        "netdev": "ibp188s0",
        "link_layer": "infiniband",
        "rate_gbps": 400,
        "numa_node": 1,
        "gpu": 6,
    },
]


def fixture_text(kind: str, name: str) -> str:
    return (FIXTURES / kind / name).read_text()


Reply = str | tuple[int, str] | CommandResult | Callable[[tuple[str, ...]], CommandResult]


class ScriptedTransport:
    """Answers commands from a table: (host, argv prefix) -> reply; records every call.

    A reply is stdout text (rc 0), (rc, stdout), a CommandResult, or a function of the argv. Commands
    with no entry answer rc 127 "command not found", like a host without the tool.
    """

    def __init__(self, replies: dict[tuple[str, tuple[str, ...]], Reply] | None = None):
        self.replies = dict(replies or {})
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.started: list[tuple[str, tuple[str, ...]]] = []
        self.stopped: list[tuple[str, tuple[str, ...]]] = []
        self._lock = threading.Lock()

    def on(self, host: str, *argv: str, reply: Reply) -> ScriptedTransport:
        self.replies[(host, tuple(argv))] = reply
        return self

    def _lookup(self, host: str, argv: tuple[str, ...]):
        best = None  # the longest matching prefix; a host's own entry beats a "*" one of the same length
        for (h, prefix), reply in self.replies.items():
            rank = (len(prefix), h == host)
            if h in (host, "*") and argv[: len(prefix)] == prefix and (best is None or rank > best[0]):
                best = (rank, reply)
        return best[1] if best else None

    def run(self, host, argv, timeout) -> CommandResult:
        argv = tuple(argv)
        with self._lock:
            self.calls.append((host.name, argv))
        reply = self._lookup(host.name, argv)
        if reply is None:
            return CommandResult(127, "", f"{argv[0]}: command not found", 0.0, argv=argv)
        if callable(reply):
            return reply(argv)
        if isinstance(reply, CommandResult):
            return reply
        rc, out = (0, reply) if isinstance(reply, str) else reply
        return CommandResult(rc, out, "", 0.0, argv=argv)

    def start(self, host, argv, limit):
        transport = self
        with self._lock:
            self.started.append((host.name, tuple(argv)))

        class _Server:
            def stop(self_inner):
                with transport._lock:
                    transport.stopped.append((host.name, tuple(argv)))
                return CommandResult(0, "", "", 0.0)

        return _Server()

    def called(self, host: str, program: str) -> list[tuple[str, ...]]:
        return [argv for h, argv in self.calls if h == host and program in argv]


def node(name: str = "n1", rack: str = "r01", **hostvars):
    base = {
        "gpu_model": "h100-sxm",
        "gpu_count": 8,
        "iu_size": 4,
        "rack": rack,
        "rdma_nics": H100_NICS,
        # Loopback only, even where nothing connects (the transport is scripted).
        "ansible_host": f"127.0.100.{abs(hash(name)) % 200 + 1}",
    }
    base.update(hostvars)
    return build_node(name, base)


def context(transport, n=None, timeout: float = 5.0, **options) -> NodeContext:
    n = n or node()
    return NodeContext(n, profile_of(n), transport, RunOptions(timeout=timeout, **options))


def only(results, **match):
    """The one result matching every given attribute (iu=None included)."""
    found = [r for r in results if all(getattr(r, k) == v for k, v in match.items())]
    assert len(found) == 1, f"expected one result matching {match}, got {found}"
    return found[0]


# ----------------------------------------------------------------------------- simulated hosts


class VirtualInventory:
    """``clusterctl virtual create`` in a tmp dir, per-host variables (faults) in host_vars, then ``up``;
    the caller calls ``down`` (the fixtures do, in teardown)."""

    def __init__(
        self,
        root: Path,
        nodes: int,
        racks: int,
        host_vars: dict[str, dict] | None = None,
        fabric: str = "ib",
        group_vars: dict | None = None,
        net: int = 0,
    ):
        """``net``: the machines' 127.<net>.R.N (0: `virtual create`'s default, the machine chain's; a module
        with a net of its own runs beside the chain, tests/conftest.py)."""
        self.root = root
        if net:  # what `virtual create` writes, on another net (the command has no option for it)
            from sim.hosts import create

            create.write(root, nodes, racks, fabric=fabric, faults="none", force=True, net=net)
        else:
            done = self.clusterctl(
                "virtual",
                "create",
                str(root),
                "--nodes",
                str(nodes),
                "--racks",
                str(racks),
                "--faults",
                "none",
                "--fabric",
                fabric,
                "--force",
            )
            assert done.returncode == 0, done.stderr
        (root / "host_vars").mkdir(exist_ok=True)
        for host, variables in (host_vars or {}).items():
            (root / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(variables, sort_keys=False))
        if group_vars:
            all_vars = root / "group_vars" / "all.yml"
            all_vars.write_text(all_vars.read_text() + "\n" + yaml.safe_dump(group_vars, sort_keys=False))

    @staticmethod
    def clusterctl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "cli.main", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def up(self) -> None:
        done = self.clusterctl("virtual", "up", str(self.root))
        assert done.returncode == 0, done.stderr

    def run_on(self, host: str, *argv: str, stdin: str | None = None) -> str:
        """Run argv on a simulated machine over SSH, as root through sudo; returns stdout."""
        from sim.hosts import lifecycle as simulate

        done = subprocess.run(
            simulate.ssh_argv(self.root, host, *argv),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def install_iu_units(self, host: str, numa_of_iu: dict[int, int]) -> None:
        """Write vllm-iu@.service and per-IU drop-ins pinning IU N to NUMA node numa_of_iu[N], the way the
        vllm role does (CPUs from the host's live /sys/devices/system/node/node<M>/cpulist); one shell."""
        unit_dir = "/etc/systemd/system"
        script = [
            "set -e",
            f"mkdir -p {unit_dir}",
            f"printf '[Unit]\\nDescription=vLLM inference unit %%i\\n\\n[Service]\\n"
            f"ExecStart=/opt/vllm/bin/vllm serve\\n' > '{unit_dir}/vllm-iu@.service'",
        ]
        for index, numa in numa_of_iu.items():
            dropin = f"{unit_dir}/vllm-iu@{index}.service.d"
            script += [
                f"mkdir -p '{dropin}'",
                f"printf '[Service]\\nCPUAffinity=%s\\nNUMAPolicy=bind\\nNUMAMask={numa}\\n' "
                f"\"$(cat /sys/devices/system/node/node{numa}/cpulist)\" > '{dropin}/10-numa.conf'",
            ]
        self.run_on(host, "sh", "-s", stdin="\n".join(script) + "\n")

    def install_dcgm(self, host: str) -> None:
        """Install DCGM's stand-in package from the served NVIDIA repository and start its host engine, as
        nvidia_stack does on a provisioned host (a machine has no dcgmi of its own); one shell."""
        from sim.aptrepo import catalog, repo
        from sim.hosts import repos

        package = next(p for p in catalog.nvidia_packages(b"") if p.name == "datacenter-gpu-manager")
        url = f"{repos.APT_URL}/{repo.NVIDIA_PATH}/{repo.NVIDIA_DISTRO}/{repo.NVIDIA_ARCH}/{package.filename}"
        deb = f"/var/cache/apt/archives/{package.filename}"
        self.run_on(host, "sh", "-s", stdin=(
            "set -e\n"
            f"python3 -c 'import shutil, sys, urllib.request; shutil.copyfileobj(urllib.request.urlopen(sys.argv[1],"
            f" timeout=20), open(sys.argv[2], \"wb\"))' {url} {deb}\n"
            f"dpkg -i {deb} >/dev/null\n"
            "systemctl enable --now nvidia-dcgm.service\n"))

    def down(self) -> None:
        self.clusterctl("virtual", "down", str(self.root))
