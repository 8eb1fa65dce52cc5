"""nvidia_stack's repository entry (roles/nvidia_stack/tasks/repository.yml) on a site with its own mirror and
no route to NVIDIA: the real cuda-keyring's .list names developer.download.nvidia.com whatever URL the deb came
from, so the role must point the entry at nvidia_stack_repo_url or apt never reaches the mirror.

The task file runs unchanged with connection local, in a mount namespace of its own: /etc/apt/sources.list.d
and /usr/share/keyrings are temporary directories holding what the stand-in cuda-keyring installs, /etc/hosts
sends NVIDIA's server to a loopback address where nothing listens (the air gap), and APT_CONFIG keeps apt's
lists, cache and configuration in the temporary directory. This host's own apt state is never touched.

A mirror that re-signs the repository with the site's key (the stand-in's site-mirror/ copy) is checked with
apt itself on the entry and key file the role's expressions render: refused with cuda-keyring's key, verified
with the mirror's."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim.aptrepo import build_repositories, serve
from sim.aptrepo.serve import make_server
from tests.helpers import render_role_text, role_tasks

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[4]
MIRROR_HOST = "127.0.71.1"
AIR_GAP = "127.0.71.2"  # NVIDIA's server resolves here, and nothing listens: no route out
NVIDIA_HOST = "developer.download.nvidia.com"
KEYRING_LIST = "etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """The stand-in NVIDIA repository, served as a site's mirror would serve NVIDIA's."""
    server = make_server(Path("/nonexistent"), MIRROR_HOST, 0)
    port = server.server_address[1]
    server.server_close()
    root = tmp_path_factory.mktemp("mirror") / "repo"
    repos = build_repositories(root, f"http://{MIRROR_HOST}:{port}")
    with serve(root, MIRROR_HOST, port):
        yield repos


def installed_keyring(tmp_path: Path, repos) -> Path:
    """What dpkg leaves of the stand-in cuda-keyring: its .list and key, in directories the namespace mounts."""
    deb = repos.root / "nvidia/compute/cuda/repos/ubuntu2204/x86_64/cuda-keyring_1.1-1_all.deb"
    unpacked = tmp_path / "unpacked"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "keyrings").mkdir()
    (tmp_path / "etc-keyrings").mkdir()
    shutil.copy(unpacked / KEYRING_LIST, tmp_path / "sources.list.d")
    shutil.copy(unpacked / "usr/share/keyrings/cuda-archive-keyring.gpg", tmp_path / "keyrings")
    for sub in ("lists/partial", "cache/archives/partial", "empty"):
        (tmp_path / sub).mkdir(parents=True)
    (tmp_path / "hosts").write_text(f"127.0.0.1 localhost\n{AIR_GAP} {NVIDIA_HOST}\n")
    (tmp_path / "apt.conf").write_text(
        f'Dir::State::Lists "{tmp_path}/lists";\nDir::Cache "{tmp_path}/cache";\n'
        f'Dir::Etc::SourceList "/dev/null";\nDir::Etc::Parts "{tmp_path}/empty";\n'
        f'Dir::Etc::Preferences "/dev/null";\nDir::Etc::PreferencesParts "{tmp_path}/empty";\n'
        'Acquire::Retries "0";\nAPT::Sandbox::User "root";\nDebug::NoLocking "1";\n')
    return tmp_path / "sources.list.d"


def in_namespace(tmp_path: Path, *commands: list[str]) -> subprocess.CompletedProcess:
    """Run ``commands`` one after the other (stopping at the first failure) with the temporary apt directories
    mounted over the host's, in a mount namespace that ends with them."""
    mounts = [("sources.list.d", "/etc/apt/sources.list.d"), ("keyrings", "/usr/share/keyrings"),
              ("etc-keyrings", "/etc/apt/keyrings"), ("hosts", "/etc/hosts")]
    script = "set -e\n" + "".join(f"mount --bind {shlex.quote(str(tmp_path / src))} {dest}\n" for src, dest in mounts)
    script += "".join(shlex.join(command) + "\n" for command in commands)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "APT_", "http_", "https_"))}
    env.update(APT_CONFIG=str(tmp_path / "apt.conf"), ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               LC_ALL="C.UTF-8")
    return subprocess.run(["unshare", "--mount", "sh", "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def role_run(tmp_path: Path, repos) -> list[str]:
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "name": "repository", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "repository", "ansible.builtin.import_tasks":
                   str(REPO / "roles/nvidia_stack/tasks/repository.yml")}],
    }]))
    (tmp_path / "extra.json").write_text(json.dumps({
        "ansible_python_interpreter": sys.executable,
        "nvidia_stack_repo_url": repos.nvidia_repo_url, "nvidia_stack_repo_distro": "ubuntu2204",
        "nvidia_stack_repo_arch": "x86_64", "nvidia_stack_keyring_deb": "cuda-keyring_1.1-1_all.deb",
        "_nvidia_stack_repo": f"{repos.nvidia_repo_url}/ubuntu2204/x86_64",
        # what tasks/packages.yml read from dpkg first: the keyring installed, none of its files missing
        "_nvidia_stack_installed": {"cuda-keyring": "1.1-1"}, "_nvidia_stack_dpkg": {"stdout_lines": []},
        # and main.yml's reading of the mirror key variables, unset: NVIDIA's signature, cuda-keyring's key
        "_nvidia_stack_mirror_key": {"armored": "", "fingerprint": "", "problem": ""},
        "_nvidia_stack_mirror_keyring": "/etc/apt/keyrings/cuda-mirror.asc",
        "clusterctl_proxy_env": {},
    }))
    return [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local", str(play),
            "-e", f"@{tmp_path / 'extra.json'}"]


def changed(done: subprocess.CompletedProcess) -> int:
    return int(re.search(r"localhost\s*:.*?changed=(\d+)", done.stdout.split("PLAY RECAP")[-1]).group(1))


def test_the_keyring_entry_as_shipped_cannot_reach_nvidia_from_an_air_gapped_site(mirror, tmp_path):
    """The control: the stand-in keyring's own entry, as NVIDIA's, sends apt past the mirror."""
    installed_keyring(tmp_path, mirror)
    done = in_namespace(tmp_path, ["apt-get", "update"])
    assert f"Failed to fetch https://{NVIDIA_HOST}/compute/cuda/repos/ubuntu2204/x86_64/" in done.stderr, (
        done.stdout + done.stderr)


def test_the_role_points_cuda_keyring_s_entry_at_the_mirror_and_apt_resolves_the_pins_from_it(mirror, tmp_path):
    sources = installed_keyring(tmp_path, mirror)
    policy = ["apt-cache", "policy", "nvidia-fabricmanager-550"]
    done = in_namespace(tmp_path, role_run(tmp_path, mirror), ["apt-get", "update"], policy)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert (sources / Path(KEYRING_LIST).name).read_text() == (
        f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {mirror.nvidia_repo_url}/ubuntu2204/x86_64/ /\n")
    assert "W:" not in done.stderr and "E:" not in done.stderr and NVIDIA_HOST not in done.stderr, done.stderr
    assert f"550.127.08-1 500\n        500 {mirror.nvidia_repo_url}/ubuntu2204/x86_64  Packages" in done.stdout, (
        done.stdout[-2000:])
    assert changed(done) == 1, done.stdout[-3000:]  # the entry
    # the forced refresh ran (the module calls an unchanged package set ok), and fetched from the mirror
    assert re.search(r"TASK \[Refresh the apt lists after the repository entry changed\] \**\nok:", done.stdout)
    assert f"Hit:1 {mirror.nvidia_repo_url}/ubuntu2204/x86_64  InRelease" in done.stdout, done.stdout[-2000:]

    again = in_namespace(tmp_path, role_run(tmp_path, mirror))
    assert again.returncode == 0 and changed(again) == 0, again.stdout[-3000:]


def rendered_entry(tmp_path: Path, repos, key: str, fingerprint: str) -> None:
    """What the role writes for these mirror key variables, rendered from its own tasks into the namespace's
    directories: the key file (when one is set) and cuda-keyring's entry naming the re-signed copy."""
    fact = role_tasks("nvidia_stack", "main.yml")[0]["ansible.builtin.set_fact"]["_nvidia_stack_mirror_key"]
    variables = {"nvidia_stack_mirror_key": key, "nvidia_stack_mirror_key_fingerprint": fingerprint,
                 "_nvidia_stack_mirror_keyring": "/etc/apt/keyrings/cuda-mirror.asc",
                 "_nvidia_stack_repo": f"{repos.mirror_url(repos.nvidia_repo_url)}/ubuntu2204/x86_64"}
    variables["_nvidia_stack_mirror_key"] = render_role_text(fact, variables)
    tasks = {t["name"]: t for t in role_tasks("nvidia_stack", "repository.yml")}
    entry = tasks["Point cuda-keyring's repository entry at nvidia_stack_repo_url"]
    variables |= {name: render_role_text(text, variables) for name, text in entry["vars"].items()}
    (tmp_path / "sources.list.d" / Path(KEYRING_LIST).name).write_text(
        render_role_text(entry["ansible.builtin.copy"]["content"], variables))
    if key:
        (tmp_path / "etc-keyrings/cuda-mirror.asc").write_text(
            render_role_text(tasks["Install the mirror's signing key"]["ansible.builtin.copy"]["content"], variables))


def test_a_re_signing_mirror_fails_with_cuda_keyring_s_key_and_passes_with_its_own(mirror, tmp_path):
    installed_keyring(tmp_path, mirror)
    url = f"{mirror.mirror_url(mirror.nvidia_repo_url)}/ubuntu2204/x86_64"
    rendered_entry(tmp_path, mirror, "", "")
    refused = in_namespace(tmp_path, ["apt-get", "update"])
    assert refused.returncode != 0
    assert (f"W: GPG error: {url}  InRelease: The following signatures couldn't be verified because the public key "
            f"is not available: NO_PUBKEY {mirror.mirror_fingerprint[-16:]}") in refused.stderr, refused.stderr
    assert f"E: The repository '{url}  InRelease' is not signed." in refused.stderr, refused.stderr

    rendered_entry(tmp_path, mirror, str(mirror.mirror_key), mirror.mirror_fingerprint)
    done = in_namespace(tmp_path, ["apt-get", "update"], ["apt-cache", "policy", "nvidia-fabricmanager-550"])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "W:" not in done.stderr and "E:" not in done.stderr, done.stderr
    assert f"550.127.08-1 500\n        500 {url}  Packages" in done.stdout, done.stdout[-2000:]
