"""The virtual cluster's package sources (sim/hosts/repos.py): built and served on their own loopback address by
``virtual up``, found there by apt's and pip's URLs that ``virtual create`` writes, stopped by the last ``down``.

The server binds the fixed 127.0.255.1:8080 the inventories name: run under ``flock /tmp/clusterctl-virtual.lock``
like the machine tests."""

from __future__ import annotations

import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from sim.hosts import create, repos

pytestmark = [pytest.mark.machines(order=4), pytest.mark.timeout(600), pytest.mark.skipif(
    shutil.which("apt-ftparchive") is None or shutil.which("gpg") is None,
    reason="the stand-in repositories need apt-utils and gpg")]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_created_inventory_points_the_roles_at_the_local_sources_only():
    values = yaml.safe_load(create.render(3, 2)["group_vars/all.yml"])
    for name in ("nvidia_stack_repo_url", "consul_agent_repo_url", "eas_agent_index_url",
                 "inference_unit_pip_index_url"):
        assert values[name].startswith(f"http://{repos.ADDRESS}:{repos.PORT}/"), (name, values[name])
    assert all(line.count("==") == 1 for line in values["inference_unit_pip_constraints"])
    # the role defaults stay the vendors' own
    defaults = yaml.safe_load(Path("roles/nvidia_stack/defaults/main.yml").read_text())
    assert defaults["nvidia_stack_repo_url"].startswith("https://developer.download.nvidia.com/")
    # the address is no machine's: machines are 127.0.R.11-250 with R <= 254
    assert int(repos.ADDRESS.split(".")[2]) == 255


@pytest.fixture
def short_tmp():
    """gpg-agent's socket goes under the build's GNUPGHOME: pytest's tmp paths exceed sun_path's 108 bytes."""
    directory = Path(tempfile.mkdtemp(prefix="repos-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_served_for_a_user_until_the_last_user_releases_it(short_tmp, monkeypatch):
    tmp_path = short_tmp
    monkeypatch.setenv("CLUSTERCTL_REPO_CACHE", str(tmp_path / "cache"))
    # Its own address too: the suite's machines (or a developer's) may be using the real server right now,
    # which this test's cache does not know (it stopped with "taken by a process that is not the package
    # server" in a full run). 127.0.254.254 is no machine's (machines are 127.0.R.11-250).
    monkeypatch.setenv("CLUSTERCTL_REPO_ADDRESS", "127.0.254.254:8080")
    monkeypatch.setattr(repos, "ADDRESS", "127.0.254.254")
    monkeypatch.setattr(repos, "BASE_URL", "http://127.0.254.254:8080")
    monkeypatch.setattr(repos, "APT_URL", "http://127.0.254.254:8080/apt")
    monkeypatch.setattr(repos, "INDEX_URL", "http://127.0.254.254:8080/pypi/simple")
    first, second = tmp_path / "a" / ".sim", tmp_path / "b" / ".sim"
    for state in (first, second):
        (state / "machines").mkdir(parents=True)
    values = repos.inventory_values()
    try:
        assert repos.ensure_serving(first) == repos.BASE_URL
        assert repos.ensure_serving(second) == repos.BASE_URL  # the running server is reused
        status, key = _get(f"{values['consul_agent_repo_url']}/gpg")
        assert status == 200 and key.startswith(b"-----BEGIN PGP PUBLIC KEY BLOCK-----")
        status, body = _get(f"{values['nvidia_stack_repo_url']}/ubuntu2204/x86_64/Packages")
        assert status == 200 and b"Package: nvidia-fabricmanager-550" in body
        # apt fetches a flat repository's packages as <url>/./<file> (Filename: ./x.deb)
        filename = next(line.split(": ", 1)[1] for line in body.decode().splitlines()
                        if line.startswith("Filename: ./nvidia-utils-550_"))
        assert _get(f"{values['nvidia_stack_repo_url']}/ubuntu2204/x86_64/{filename}")[0] == 200
        status, body = _get(f"{values['inference_unit_pip_index_url']}/vllm/")
        assert status == 200 and b"vllm-0.6.6.post1-" in body
        # the signing key's GNUPGHOME is never served
        assert _get(f"{repos.APT_URL}/.gnupg/pubring.kbx")[0] == 404
        assert repos.release(first) is False  # the other inventory still has machines
        assert _get(f"{repos.APT_URL}/hashicorp/gpg")[0] == 200
        # a user whose machines are gone (a killed up, a removed tmp dir) does not keep it running
        (second / "machines").rmdir()
        assert repos.release(tmp_path / "nobody") is True
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{repos.APT_URL}/hashicorp/gpg", timeout=2)
    finally:
        repos.release(first)
        repos.release(second)
