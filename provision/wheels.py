"""The node-side deployables as small wheels of their own, built from this checkout: the EAS agent (what the
eas_agent role installs on GPU nodes) and the edge (the OpenAI-compatible router in front of the pool).

The controller's distribution (``clusterctl``: ansible-core, fabric, rich, Python >= 3.11) is the wrong thing to
put on a node or an edge host: Ubuntu 22.04's python3 is 3.10, and neither needs the controller's tools. So:

- ``clusterctl-eas-agent`` carries ``eas_agent``, ``eas_wire`` and ``consul_io``, the ``eas-agent`` console
  script and the agent's own dependencies (the version ranges are the controller's, read from pyproject.toml,
  so the two never drift);
- ``clusterctl-eas-edge`` carries ``edge`` (its pool reader ``edge.pool`` included), ``eas_wire`` and
  ``consul_io``, the ``eas-edge`` console script and the dependencies of edge/requirements.txt.

Neither carries anything of the controller or the simulators, nor the other deployable
(tests/provision/test_wheels.py). Both say ``Requires-Python: >=3.10`` (22.04: 3.10, 24.04: 3.12), and their
code parses as 3.10 (the same test).

**Version.** ``<the project's version>+src.<12 hex digits>``: the local part is a hash of the packaged files
(paths and contents), so a code change gives a new version and ``pip install`` of the new wheel replaces the
installed one (pip skips a wheel whose name and version are already installed), while the same checkout gives
the same version and byte-identical wheels.

    python -m provision.wheels agent DIR     # prints the wheel's path; set eas_agent_wheel to it
    python -m provision.wheels edge DIR      # pip install it on the edge host

The wheel is written directly (PEP 427: a zip with ``*.dist-info/{METADATA,WHEEL,RECORD,entry_points.txt}``)
instead of through a build backend: the controller then needs no setuptools/wheel/build of a particular version
and no index to fetch them from (fixed timestamps, sorted members).
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import tomllib
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
REQUIRES_PYTHON = ">=3.10"
# consul_io imports requests itself; the controller and the edge get it through py-consul, so neither
# pyproject nor edge/requirements.txt lists it.
EXTRA_REQUIREMENTS = ("requests>=2.28,<3",)
# Distributions the agent imports (eas_agent/, eas_wire/, consul_io/), by their names in pyproject.toml.
AGENT_DEPENDENCIES = ("click", "psutil", "py-consul", "prometheus-client", "PyYAML", "nvidia-ml-py")
EDGE_REQUIREMENTS = REPO_ROOT / "edge" / "requirements.txt"
HASH_DIGITS = 12
_EPOCH = (1980, 1, 1, 0, 0, 0)


def normalize(name: str) -> str:
    """PEP 503 normalized project name (the index's directory names)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(out_dir: Path, name: str, version: str, files: Mapping[str, bytes], *, summary: str,
                requires_python: str, requires_dist: Iterable[str] = (),
                console_scripts: Mapping[str, str] | None = None) -> Path:
    """A pure-Python ``py3-none-any`` wheel holding ``files`` (archive path -> content)."""
    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {summary}",
                f"Requires-Python: {requires_python}", *(f"Requires-Dist: {r}" for r in requires_dist)]
    members = dict(sorted(files.items()))
    members[f"{info}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    members[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: clusterctl (provision/wheels.py)\n"
                                b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    if console_scripts:
        members[f"{info}/entry_points.txt"] = (
            "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(console_scripts.items()))).encode()
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in members.items())
    members[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in members.items():
            entry = zipfile.ZipInfo(path, _EPOCH)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, data)
    return wheel


def project(root: Path = REPO_ROOT) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]


def agent_requirements(root: Path = REPO_ROOT) -> list[str]:
    """The agent's dependencies with the controller's version ranges (pyproject.toml), and requests."""
    declared = {normalize(re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0]): spec
                for spec in project(root)["dependencies"]}
    missing = [name for name in AGENT_DEPENDENCIES if normalize(name) not in declared]
    if missing:
        raise RuntimeError(f"pyproject.toml: the agent's dependencies {missing} are not in [project].dependencies")
    return [declared[normalize(name)] for name in AGENT_DEPENDENCIES] + list(EXTRA_REQUIREMENTS)


def edge_requirements(root: Path = REPO_ROOT) -> list[str]:
    """edge/requirements.txt (the edge host's dependencies, the controller's ranges), and requests."""
    lines = (line.split("#", 1)[0].strip() for line in (root / "edge" / "requirements.txt").read_text().splitlines())
    return [line for line in lines if line] + list(EXTRA_REQUIREMENTS)


@dataclass(frozen=True)
class Deployable:
    """One node-side wheel: its distribution name, the top-level packages it carries, its console script
    (a ``[project.scripts]`` name of pyproject.toml) and where its dependencies come from."""

    dist: str
    packages: tuple[str, ...]
    script: str
    summary: str
    requirements: Callable[[Path], list[str]]


AGENT = Deployable("clusterctl-eas-agent", ("eas_agent", "eas_wire", "consul_io"), "eas-agent",
                   "clusterctl EAS agent: per-IU load scores published to Consul", agent_requirements)
EDGE = Deployable("clusterctl-eas-edge", ("edge", "eas_wire", "consul_io"), "eas-edge",
                  "clusterctl edge: an OpenAI-compatible router over the pool's scores", edge_requirements)
DEPLOYABLES = {"agent": AGENT, "edge": EDGE}
DIST_NAME = AGENT.dist  # the agent's distribution (the eas_agent role's eas_agent_package)


def package_files(packages: Iterable[str], root: Path = REPO_ROOT) -> dict[str, bytes]:
    """archive path -> content of every ``*.py`` under the top-level ``packages`` (caches left out)."""
    paths = sorted(p for package in packages for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts)
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in paths}


def source_version(base: str, files: Mapping[str, bytes]) -> str:
    """``base`` with a local part naming the packaged sources: ``0.1.0+src.1a2b3c4d5e6f``."""
    digest = hashlib.sha256()
    for path, data in sorted(files.items()):
        digest.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
    return f"{base}+src.{digest.hexdigest()[:HASH_DIGITS]}"


def build_wheel(deployable: Deployable, out_dir: Path, root: Path = REPO_ROOT) -> Path:
    """The wheel of ``deployable`` from the checkout at ``root``, written into ``out_dir``."""
    meta = project(root)
    files = package_files(deployable.packages, root)
    return write_wheel(out_dir, deployable.dist, source_version(meta["version"], files), files,
                       summary=deployable.summary, requires_python=REQUIRES_PYTHON,
                       requires_dist=deployable.requirements(root),
                       console_scripts={deployable.script: meta["scripts"][deployable.script]})


def build_agent_wheel(out_dir: Path) -> Path:
    return build_wheel(AGENT, out_dir)


def build_edge_wheel(out_dir: Path) -> Path:
    return build_wheel(EDGE, out_dir)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in DEPLOYABLES:
        print(f"usage: python -m provision.wheels {{{','.join(DEPLOYABLES)}}} OUT_DIR", file=sys.stderr)
        return 2
    print(build_wheel(DEPLOYABLES[args[0]], Path(args[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
