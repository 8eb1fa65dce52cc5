"""A local PEP 503 package index for the virtual cluster: what the eas_agent, eas_edge and inference_unit roles
install.

    <root>/simple/index.html, <root>/simple/<project>/index.html   (links with #sha256= and data-requires-python)
    <root>/files/*.whl

It holds:
- ``clusterctl-eas-agent`` and ``clusterctl-eas-edge``: the agent's and the edge's own wheels, built from the
  checkout (provision/wheels.py);
- ``vllm`` 0.6.6.post1 (the version inference_unit pins): a stand-in whose ``vllm serve`` checks its environment
  and runs the simulated vLLM server (sim/pypi/vllm_cli.py; sim.vllm vendored as ``vllm._sim.vllm`` so the wheel
  needs nothing of this checkout at run time);
- ``nvidia-ml-py``: a stand-in (sim/nvml_standin/pynvml.py) answering the agent's NVML calls from the machine's
  GPU file, at the version of the real one this controller runs (whose signatures it is tested against) with a
  local label saying what it is; the real one, which needs libnvidia-ml and a driver, is not in the index;
- the other wheels these depend on, at the versions this controller runs (the same as the constraints file the role
  gets), fetched once with ``pip download`` from the index pip is configured with and cached outside the
  checkout. On a real site that is the site's mirror; here it is PyPI.

Served like the apt stand-ins by sim.aptrepo.serve (loopback only). Roles get
``<url>/simple`` as inference_unit_pip_index_url / eas_agent_index_url (eas_edge_index_url defaults to it),
never a public index.
"""

from __future__ import annotations

import ast
import hashlib
import html
import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from provision.wheels import (
    REPO_ROOT,
    REQUIRES_PYTHON,
    build_agent_wheel,
    build_edge_wheel,
    normalize,
    write_wheel,
)
from sim.nvml_standin import MODULE_FILE as NVML_STANDIN

VLLM_VERSION = "0.6.6.post1"
NVML_DIST = "nvidia-ml-py"
NVML_STANDIN_VERSION = f"{importlib.metadata.version(NVML_DIST)}+clusterctl.standin"
# Distributions the two wheels need on the node, with their own dependencies (requests' closure), less the
# stand-in's (NVML_DIST).
AGENT_CLOSURE = ("click", "psutil", "py-consul", "prometheus-client", "PyYAML", "requests",
                 "certifi", "charset-normalizer", "idna", "urllib3", "cryptography", "cffi", "pycparser")
VLLM_CLOSURE = ("prometheus-client",)
# The edge's (edge/requirements.txt) beyond the agent's: aiohttp's closure for the machines' Python 3.11.
EDGE_CLOSURE = ("aiohttp", "aiohappyeyeballs", "aiosignal", "attrs", "frozenlist", "multidict", "propcache", "yarl",
                "typing-extensions")


def pins(names: tuple[str, ...]) -> list[str]:
    """name==version as installed on this controller (the versions the project's tests run)."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in names]


# Project packages the simulated server imports, and where they live inside the stand-in wheel.
VENDORED = {"sim": "vllm._sim", "eas_agent": "vllm._eas_agent", "eas_wire": "vllm._eas_wire", "edge": "vllm._edge"}


def _vendored_name(module: str) -> str | None:
    top = module.split(".", 1)[0]
    return VENDORED[top] + module[len(top):] if top in VENDORED else None


def vendored_sim() -> dict[str, bytes]:
    """sim.vllm.server and every project module it imports (sim.*, eas_agent.*, eas_wire.*, edge.*), as
    vllm/_sim/..., vllm/_eas_agent/..., vllm/_eas_wire/... and vllm/_edge/..., imports rewritten."""
    todo, seen, files = ["sim.vllm.server"], set(), {}
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = REPO_ROOT / (module.replace(".", "/") + ".py")
        if not path.is_file():
            path = REPO_ROOT / module.replace(".", "/") / "__init__.py"
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module and _vendored_name(node.module):
                todo.append(node.module)
                # `from package import module`: the submodules too
                todo += [f"{node.module}.{a.name}" for a in node.names
                         if (REPO_ROOT / node.module.replace(".", "/") / f"{a.name}.py").is_file()]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if _vendored_name(a.name)]
        target = _vendored_name(module).replace(".", "/")
        relative = f"{target}.py" if path.name != "__init__.py" else f"{target}/__init__.py"
        rewritten = source
        for top, inside in VENDORED.items():
            rewritten = rewritten.replace(f"from {top}.", f"from {inside}.").replace(f"import {top}.", f"import {inside}.")
        files[relative] = rewritten.encode()
    for package in {str(Path(p).parent) for p in files}:
        files.setdefault(f"{package}/__init__.py", b"")
    return files


def build_vllm_standin(out_dir: Path) -> Path:
    files = {"vllm/__init__.py": f'"""clusterctl stand-in for vLLM {VLLM_VERSION} (see cli.py)."""\n__version__ = '
                                 f'"{VLLM_VERSION}"\n'.encode(),
             "vllm/cli.py": (Path(__file__).parent / "vllm_cli.py").read_bytes(),
             **vendored_sim()}
    return write_wheel(out_dir, "vllm", VLLM_VERSION, files,
                       summary="clusterctl stand-in for vLLM: environment checks + the simulated vLLM server",
                       requires_python=">=3.9", requires_dist=pins(VLLM_CLOSURE),
                       console_scripts={"vllm": "vllm.cli:main"})


def build_nvml_standin(out_dir: Path) -> Path:
    return write_wheel(out_dir, NVML_DIST, NVML_STANDIN_VERSION, {"pynvml.py": NVML_STANDIN.read_bytes()},
                       summary="clusterctl stand-in for nvidia-ml-py: pynvml answering from the machine's GPU file",
                       requires_python=REQUIRES_PYTHON)


def download(cache: Path, requirements: list[str]) -> list[Path]:
    """Binary wheels for ``requirements`` (no resolution: the closure is listed) into ``cache``, once."""
    cache.mkdir(parents=True, exist_ok=True)
    wanted = [r for r in requirements if not any(_is_wheel_of(p, r) for p in cache.glob("*.whl"))]
    if wanted:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--dest", str(cache), *wanted], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"pip download {' '.join(wanted)} failed: {done.stderr.strip()[-800:]}")
    return [next(p for p in sorted(cache.glob("*.whl")) if _is_wheel_of(p, r)) for r in requirements]


def _is_wheel_of(wheel: Path, requirement: str) -> bool:
    name, version = requirement.split("==")
    dist, wheel_version = wheel.name.split("-")[:2]
    return normalize(dist) == normalize(name) and wheel_version == version


def _requires_python(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        for line in archive.read(meta).decode(errors="replace").splitlines():
            if line.startswith("Requires-Python:"):
                return line.split(":", 1)[1].strip()
    return ""


def build_index(root: Path, cache: Path) -> dict[str, Path]:
    """Lay out the index under ``root`` (rebuilt each time: seconds). Returns project -> wheel of the wheels built
    here (the agent's and the two stand-ins)."""
    if root.exists():
        shutil.rmtree(root)
    files = root / "files"
    own = {"clusterctl-eas-agent": build_agent_wheel(files), "clusterctl-eas-edge": build_edge_wheel(files),
           "vllm": build_vllm_standin(files), NVML_DIST: build_nvml_standin(files)}
    for wheel in download(cache, sorted(set(pins(AGENT_CLOSURE) + pins(EDGE_CLOSURE) + pins(VLLM_CLOSURE)))):
        shutil.copy2(wheel, files / wheel.name)
    projects: dict[str, list[Path]] = {}
    for wheel in sorted(files.glob("*.whl")):
        projects.setdefault(normalize(wheel.name.split("-")[0]), []).append(wheel)
    simple = root / "simple"
    simple.mkdir()
    links = "".join(f'<a href="{name}/">{name}</a>\n' for name in sorted(projects))
    (simple / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    for name, wheels in projects.items():
        (simple / name).mkdir()
        anchors = ""
        for wheel in wheels:
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            requires = _requires_python(wheel)
            attribute = f' data-requires-python="{html.escape(requires)}"' if requires else ""
            anchors += f'<a href="../../files/{wheel.name}#sha256={digest}"{attribute}>{wheel.name}</a>\n'
        (simple / name / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{anchors}</body></html>\n")
    return own


def constraints() -> list[str]:
    """The pins the inventory gives inference_unit_pip_constraints (vLLM's dependencies here)."""
    return pins(VLLM_CLOSURE)
