"""The virtual cluster's package sources: the vendor stand-in apt repositories and the local package index,
built and served on loopback by ``clusterctl virtual up`` (and stopped by the last ``virtual down``).

A real site reaches NVIDIA's and HashiCorp's apt repositories and a package index (its mirror, or PyPI); the
machines reach stand-ins of them instead, at an address of their own that no machine uses (machines are
127.0.R.11-250, R <= 254), so ``virtual create`` can write the URLs into the inventory before anything runs:

    http://127.0.255.1:8080/apt/nvidia/compute/cuda/repos   nvidia_stack_repo_url (sim/aptrepo, flat, like NVIDIA's)
    http://127.0.255.1:8080/apt/hashicorp                   consul_agent_repo_url (key at <url>/gpg)
    http://127.0.255.1:8080/pypi/simple                     eas_agent_index_url, inference_unit_pip_index_url

What Debian ships comes from Debian's archive, as the image's sources.list says (see sim/hosts/image.py for
what the image pre-seeds).

Layout under ``$CLUSTERCTL_REPO_CACHE`` (default /var/cache/clusterctl/repos), outside any checkout::

    served/apt/      sim.aptrepo.build_repositories (reused while its recipe is unchanged)
    served/pypi/     sim.pypi.build_index (rebuilt by every ``up``: the agent wheel follows the checkout)
    server.pid, server.log, users/<digest>   the one server process and the state dirs using it

The index's third-party wheels are downloaded once into ``~/.cache/clusterctl/pypi-wheels`` (shared with
tests/integration/sim/test_pypi.py).

One server serves every inventory that is up (the address is fixed); each ``up`` registers its state dir under
``users/`` and each ``down`` removes it; the server stops when no registered state dir has machines left. It is
a separate process (``python -m sim.hosts.repos``) because ``virtual up`` returns while the machines run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from common.errors import ClusterctlError
from sim.hosts import image

# CLUSTERCTL_REPO_ADDRESS moves the server (tests/machines/sim/hosts/test_repos.py runs its own beside a suite's).
ADDRESS, _, _PORT = os.environ.get("CLUSTERCTL_REPO_ADDRESS", "127.0.255.1:8080").partition(":")
PORT = int(_PORT)
BASE_URL = f"http://{ADDRESS}:{PORT}"
APT_URL = f"{BASE_URL}/apt"
INDEX_URL = f"{BASE_URL}/pypi/simple"
START_TIMEOUT_S = 15.0
REPO_ROOT = Path(__file__).resolve().parents[2]
WHEEL_CACHE = Path.home() / ".cache" / "clusterctl" / "pypi-wheels"


class RepoError(ClusterctlError):
    pass


# The template of consul_agent_repo_key_fingerprints in a virtual inventory (inventory_values).
STANDIN_KEY_FINGERPRINTS = (
    "{{ [(lookup('ansible.builtin.file', (lookup('ansible.builtin.env', 'CLUSTERCTL_REPO_CACHE')"
    " or '/var/cache/clusterctl/repos') ~ '/served/apt/.recipe') | from_json).fingerprint] }}"
)


def cache_root() -> Path:
    return Path(os.environ.get("CLUSTERCTL_REPO_CACHE", "/var/cache/clusterctl/repos"))


def inventory_values() -> dict[str, object]:
    """What ``virtual create`` writes into group_vars/all.yml: the roles' source variables, pointed here."""
    from sim.aptrepo.repo import HASHICORP_PATH, NVIDIA_PATH
    from sim.pypi.build import constraints

    return {
        "nvidia_stack_repo_url": f"{APT_URL}/{NVIDIA_PATH}",
        "consul_agent_repo_url": f"{APT_URL}/{HASHICORP_PATH}",
        # The machines say they run Ubuntu 22.04 (their os-release; the files underneath are Debian 12's), and
        # the provisioning plays check that the suite is that release's, as on a real host. HashiCorp's
        # packages (and the stand-in's) are the same in every suite.
        "consul_agent_repo_suite": "jammy",
        # The stand-in repositories' signing key is made when they are built, and the build records its
        # fingerprint beside them (sim.aptrepo.repo, RECIPE_FILE): the pin a real site sets to HashiCorp's,
        # read on the controller from that record (never from the repository server, which serves the key).
        "consul_agent_repo_key_fingerprints": STANDIN_KEY_FINGERPRINTS,
        "eas_agent_index_url": INDEX_URL,
        "inference_unit_pip_index_url": INDEX_URL,
        "inference_unit_pip_constraints": constraints(),
    }


def _locked(cache: Path) -> contextlib.AbstractContextManager[None]:
    cache.mkdir(parents=True, exist_ok=True)
    return image.locked(cache / ".lock")


def build(progress: Callable[[str], None] = lambda line: None) -> Path:
    """Build (or reuse) both package sources under ``<cache>/served``; returns that directory."""
    from sim.aptrepo import build_repositories
    from sim.pypi import build_index

    cache = cache_root()
    served = cache / "served"
    served.mkdir(parents=True, exist_ok=True)
    progress(f"package sources: stand-in apt repositories and the package index under {served}")
    build_repositories(served / "apt", APT_URL)
    # Built beside the served tree and swapped in, so a running server never serves a half-built index.
    staging = served / ".pypi-new"
    try:
        build_index(staging, WHEEL_CACHE)
    except RuntimeError as exc:
        raise RepoError(f"building the package index failed: {exc}") from None
    old = served / ".pypi-old"
    shutil.rmtree(old, ignore_errors=True)
    if (served / "pypi").exists():
        (served / "pypi").rename(old)
    staging.rename(served / "pypi")
    shutil.rmtree(old, ignore_errors=True)
    return served


def _user_file(cache: Path, state_dir: Path) -> Path:
    return cache / "users" / hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:16]


def _live_users(cache: Path) -> list[Path]:
    """Registered state dirs that still have machines (a killed ``up`` or a removed tmp dir leaves stale ones)."""
    live = []
    for entry in sorted((cache / "users").glob("*")):
        state_dir = Path(entry.read_text().strip())
        if (state_dir / "machines").is_dir():
            live.append(entry)
        else:
            entry.unlink(missing_ok=True)
    return live


def _server_pid(cache: Path) -> int | None:
    try:
        pid = int((cache / "server.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if b"sim.hosts.repos" in cmdline else None


def _answers() -> bool:
    try:
        with socket.create_connection((ADDRESS, PORT), timeout=1):
            return True
    except OSError:
        return False


def ensure_serving(state_dir: Path, progress: Callable[[str], None] = lambda line: None) -> str:
    """Build the sources and make sure the server answers; registers ``state_dir`` as a user. Returns BASE_URL."""
    cache = cache_root()
    with _locked(cache):
        served = build(progress)
        user = _user_file(cache, state_dir)
        user.parent.mkdir(exist_ok=True)
        user.write_text(str(state_dir.resolve()) + "\n")
        if _server_pid(cache) is None or not _answers():
            if _answers():
                raise RepoError(f"{ADDRESS}:{PORT} is taken by a process that is not the package server "
                                f"({cache / 'server.pid'} names none); stop it first")
            _start(cache, served)
    return BASE_URL


def _start(cache: Path, served: Path) -> None:
    with open(cache / "server.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sim.hosts.repos", str(served)], cwd=REPO_ROOT,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    (cache / "server.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (cache / "server.log").read_text(errors="replace").strip().splitlines()[-5:]
            raise RepoError(f"the package server exited {proc.returncode}: {' | '.join(tail) or 'no output'}")
        if _answers():
            return
        time.sleep(0.1)
    proc.kill()
    raise RepoError(f"the package server did not answer on {ADDRESS}:{PORT} within {START_TIMEOUT_S:.0f}s")


def release(state_dir: Path) -> bool:
    """Unregister ``state_dir``; stop the server when no inventory with machines uses it. True if stopped."""
    cache = cache_root()
    if not cache.is_dir():
        return False
    with _locked(cache):
        _user_file(cache, state_dir).unlink(missing_ok=True)
        if _live_users(cache):
            return False
        pid = _server_pid(cache)
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            if not Path(f"/proc/{pid}").exists() or _server_pid(cache) is None:
                break
            time.sleep(0.1)
        (cache / "server.pid").unlink(missing_ok=True)
        return True


def main(argv: list[str]) -> None:
    """``python -m sim.hosts.repos SERVED_DIR``: serve it on ADDRESS:PORT until SIGTERM."""
    from sim.aptrepo.serve import make_server

    server = make_server(Path(argv[0]), ADDRESS, PORT)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main(sys.argv[1:])
