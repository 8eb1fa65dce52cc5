"""The EAS agent as its own small wheel, built from this checkout: what the eas_agent role installs on GPU nodes.

The controller's distribution (``clusterctl``: ansible-core, fabric, rich, Python >= 3.11) is the wrong thing to
put on a node: Ubuntu 22.04's python3 is 3.10, and a node needs none of the controller's tools. This wheel,
``clusterctl-eas-agent``, carries the ``eas_agent`` and ``consul_io`` packages (no simulators: they live in ``sim/``), the
``eas-agent`` console script, only the agent's own dependencies (the version ranges are the controller's, read
from pyproject.toml, so the two never drift), and ``Requires-Python: >=3.10`` (22.04: 3.10, 24.04: 3.12;
tests/integration/sim/test_pypi.py::test_agent_code_is_python_310 checks the code parses as 3.10).

    python -m cluster.agent_wheel DIR     # prints the wheel's path; set eas_agent_wheel to it

The wheel is written directly (PEP 427: a zip with ``*.dist-info/{METADATA,WHEEL,RECORD,entry_points.txt}``)
instead of through a build backend: the controller then needs no setuptools/wheel/build of a particular version
and no index to fetch them from, and the same checkout gives byte-identical wheels (fixed timestamps, sorted).
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import tomllib
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DIST_NAME = "clusterctl-eas-agent"
REQUIRES_PYTHON = ">=3.10"
# Distributions the agent imports (eas_agent/, consul_io/), by their names in pyproject.toml.
AGENT_DEPENDENCIES = ("click", "psutil", "py-consul", "prometheus-client", "PyYAML", "nvidia-ml-py")
# consul_io imports requests itself; the controller gets it through py-consul, so pyproject does not list it.
EXTRA_REQUIREMENTS = ("requests>=2.28,<3",)
PACKAGES = ("eas_agent", "consul_io")  # the agent's Consul client is the shared consul_io package
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
    members[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: clusterctl (cluster/agent_wheel.py)\n"
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


def project() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def agent_requirements() -> list[str]:
    declared = {normalize(re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0]): spec for spec in project()["dependencies"]}
    missing = [name for name in AGENT_DEPENDENCIES if normalize(name) not in declared]
    if missing:
        raise RuntimeError(f"pyproject.toml: the agent's dependencies {missing} are not in [project].dependencies")
    return [declared[normalize(name)] for name in AGENT_DEPENDENCIES] + list(EXTRA_REQUIREMENTS)


def agent_files() -> dict[str, bytes]:
    files = {}
    for path in sorted(p for package in PACKAGES for p in (REPO_ROOT / package).rglob("*.py")):
        files[path.relative_to(REPO_ROOT).as_posix()] = path.read_bytes()
    return files


def build_agent_wheel(out_dir: Path) -> Path:
    entry = project()["scripts"]["eas-agent"]
    return write_wheel(out_dir, DIST_NAME, project()["version"], agent_files(),
                       summary="clusterctl EAS agent: per-IU load scores published to Consul",
                       requires_python=REQUIRES_PYTHON, requires_dist=agent_requirements(),
                       console_scripts={"eas-agent": entry})


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m cluster.agent_wheel OUT_DIR", file=sys.stderr)
        return 2
    print(build_agent_wheel(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
