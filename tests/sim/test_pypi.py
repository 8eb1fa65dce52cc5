"""The local package index (sim/pypi) and what the roles install from it: the stand-in vLLM (environment checks,
the simulated server), the EAS agent's own wheel (only its dependencies, Requires-Python for Ubuntu 22.04/24.04)
and, as its nvidia-ml-py, the stand-in that answers NVML calls from the machine's GPU file.

pip itself installs from the index served on loopback, with pip's own configuration switched off, so a package
that would come from anywhere else fails the install."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from provision.wheels import DIST_NAME, agent_requirements, build_agent_wheel
from sim import nvml_standin
from sim.aptrepo import serve
from sim.pypi import build_index, constraints
from sim.pypi.build import NVML_DIST, VLLM_VERSION
from sim.vllm.fake_gpu import fake_gpus, write_fake_gpu_file

pytestmark = pytest.mark.timeout(600)
CACHE = Path.home() / ".cache" / "clusterctl" / "pypi-wheels"
HOST = "127.0.9.253"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("pypi") / "index"
    return root, build_index(root, CACHE)


@pytest.fixture(scope="module")
def index(built):
    with serve(built[0], HOST) as url:
        yield f"{url}/simple"


def pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}


def venv_with(tmp_path: Path, index: str, *args: str) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
    done = subprocess.run([str(venv / "bin/pip"), "install", "--quiet", "--index-url", index, *args],
                          capture_output=True, text=True, timeout=300, env=pip_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return venv


@pytest.fixture(scope="module")
def vllm_venv(index, tmp_path_factory):
    directory = tmp_path_factory.mktemp("vllm")
    pins = directory / "constraints.txt"
    pins.write_text("\n".join(constraints() + [f"vllm=={VLLM_VERSION}"]) + "\n")
    return venv_with(directory, index, "--constraint", str(pins), f"vllm=={VLLM_VERSION}")


@pytest.fixture
def node(tmp_path):
    """A model directory, writable HOME, and an nvidia-smi listing 8 GPUs (what the machines' stand-in prints)."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model/config.json").write_text("{}\n")
    (tmp_path / "home").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo \"GPU $i: NVIDIA H100 80GB HBM3 "
                                        "(UUID: GPU-$i)\"; done\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return tmp_path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def vllm(venv: Path, node: Path, port: int, **env: str) -> subprocess.Popen:
    base = {"PATH": f"{node / 'bin'}:/usr/bin:/bin", "HOME": str(node / "home"), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    full = {k: v for k, v in {**base, **env}.items() if v is not None}
    return subprocess.Popen([str(venv / "bin/vllm"), "serve", str(node / "model"), "--served-model-name", "m",
                             "--host", HOST, "--tensor-parallel-size", "4", "--max-num-seqs", "128", "--port", str(port)],
                            env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_health(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError("vllm stand-in never answered /health")


def test_vllm_installs_from_the_index_and_serves(vllm_venv, node):
    port = free_port()
    proc = vllm(vllm_venv, node, port)
    try:
        wait_health(port, proc)
        with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=5) as answer:
            assert "vllm:num_requests_running" in answer.read().decode()
        assert (node / "home/.cache/vllm").is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


@pytest.mark.parametrize(("env", "message"), [
    ({"VLLM_PORT": "{port}"}, "VLLM_PORT={port}: vLLM's internal ports"),
    ({"HOME": "/proc/nonexistent-home"}, "HOME=/proc/nonexistent-home is not writable"),
    ({"HOME": None}, "HOME is not set"),
    ({"CUDA_DEVICE_ORDER": None}, "CUDA_DEVICE_ORDER=(unset)"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, "CUDA_VISIBLE_DEVICES=0,1: need --tensor-parallel-size 4 GPUs"),
    ({"CUDA_VISIBLE_DEVICES": "6,7,8,9"}, "among the 8 nvidia-smi lists"),
    ({"PATH": "/usr/bin:/bin"}, "no NVIDIA driver"),
])
def test_vllm_refuses_the_environments_a_real_node_would_break_on(vllm_venv, node, env, message):
    port = free_port()
    env = {k: (v.format(port=port) if v else v) for k, v in env.items()}
    proc = vllm(vllm_venv, node, port, **env)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert message.format(port=port) in err, err


def test_vllm_internal_ports_collide_with_another_ius_api_port(vllm_venv, node):
    """IU0 with VLLM_PORT just below IU1's API port: the internal bind fails like vLLM's does."""
    other = free_port()
    with socket.socket() as iu1:
        iu1.bind((HOST, other))
        iu1.listen()
        port = free_port()
        proc = vllm(vllm_venv, node, port, VLLM_PORT=str(other - 1) if other - 1 != port else str(other))
        _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "Address already in use" in err, err


def test_agent_installs_from_the_index_with_only_its_dependencies(index, tmp_path):
    venv = venv_with(tmp_path, index, DIST_NAME)
    listed = subprocess.run([str(venv / "bin/pip"), "list", "--format=freeze"], capture_output=True, text=True,
                            check=True, env=pip_env()).stdout.lower()
    for controller_only in ("ansible-core", "ansible-runner", "fabric", "rich", "jinja2", "clusterctl=="):
        assert controller_only not in listed, f"{controller_only} installed on the node"
    helped = subprocess.run([str(venv / "bin/eas-agent"), "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0, helped.stderr
    assert "run" in helped.stdout
    # Its NVML is the stand-in (the real bindings would find no driver): the agent's own GPU read answers from
    # the file, as on a machine, where the file is at the stand-in's default path.
    gpu_file = tmp_path / "nvml.json"
    write_fake_gpu_file(gpu_file, fake_gpus(2, utilization=35))
    read = subprocess.run([str(venv / "bin/python"), "-m", "eas_agent.collectors.gpu"], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, env={"PATH": "/usr/bin:/bin",
                                                                    nvml_standin.FILE_ENV: str(gpu_file)})
    assert read.returncode == 0, read.stderr
    assert [g["utilization_pct"] for g in json.loads(read.stdout)["gpus"]] == [35, 35]


def test_the_index_serves_the_nvml_standin_as_nvidia_ml_py_and_not_the_real_one(built):
    root, own = built
    listed = re.findall(r'href="[^"]*/([^"/#]+\.whl)#', (root / "simple" / NVML_DIST / "index.html").read_text())
    assert listed == [own[NVML_DIST].name], listed
    with zipfile.ZipFile(own[NVML_DIST]) as wheel:
        assert wheel.read("pynvml.py") == nvml_standin.MODULE_FILE.read_bytes()
        assert [n for n in wheel.namelist() if not n.startswith("nvidia_ml_py-")] == ["pynvml.py"]
        fields = dict(metadata(own[NVML_DIST]))
    pin = next(Requirement(r) for r in agent_requirements() if Requirement(r).name == NVML_DIST)
    assert fields["Name"] == NVML_DIST and pin.specifier.contains(fields["Version"]), (pin, fields["Version"])
    assert fields["Version"].endswith("+clusterctl.standin")


# ------------------------------------------------------------------- the agent wheel's metadata

@pytest.fixture(scope="module")
def agent_wheel(tmp_path_factory) -> Path:
    return build_agent_wheel(tmp_path_factory.mktemp("wheel"))


def metadata(wheel: Path) -> list[tuple[str, str]]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return [tuple(line.split(": ", 1)) for line in archive.read(name).decode().splitlines() if ": " in line]


def test_agent_requires_a_python_ubuntu_2204_and_2404_ship(agent_wheel):
    fields = dict(metadata(agent_wheel))
    spec = SpecifierSet(fields["Requires-Python"])
    assert "3.10.12" in spec and "3.12.3" in spec, f"Ubuntu 22.04 (3.10) and 24.04 (3.12) must satisfy {spec}"
    requires = {line[1].split(">")[0].split("=")[0].split("<")[0].lower() for line in metadata(agent_wheel)
                if line[0] == "Requires-Dist"}
    assert requires == {"click", "psutil", "py-consul", "prometheus-client", "pyyaml", "nvidia-ml-py", "requests"}


# What the wheel carries and that its code is Python 3.10: tests/provision/test_wheels.py.
