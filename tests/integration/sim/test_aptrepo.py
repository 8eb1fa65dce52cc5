"""The stand-in vendor repositories: built, signed and indexed so that apt itself accepts them (and rejects
them when tampered with), with the vendors' names, versions, dependencies and unit files."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from sim.aptrepo import build_repositories, catalog, serve
from sim.aptrepo.consul_standin import ConfigError, parse_hcl
from sim.aptrepo.serve import make_server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
# dpkg-deb, apt-ftparchive (apt-utils) and gpg (gnupg): `make test` and .ci/run install them (Makefile).


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Repositories built for, and served at, a loopback address with an ephemeral port."""
    server = make_server(Path("/nonexistent"), "127.0.9.254", 0)  # reserve a port, then build for its URL
    port = server.server_address[1]
    server.server_close()
    root = tmp_path_factory.mktemp("aptrepo") / "repo"
    repos = build_repositories(root, f"http://127.0.9.254:{port}")
    with serve(root, "127.0.9.254", port) as url:
        yield repos, url


def apt_root(tmp_path: Path, repos, key_override: Path | None = None) -> list[str]:
    """An apt configuration of its own (lists, cache, sources) reading this machine's dpkg status read-only."""
    for sub in ("etc/apt/sources.list.d", "etc/apt/preferences.d", "var/lib/apt/lists/partial",
                "var/cache/apt/archives/partial", "keys"):
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
    nvidia_key = tmp_path / "keys/nvidia.asc"
    hashicorp_key = tmp_path / "keys/hashicorp.asc"
    flat = repos.root / "nvidia/compute/cuda/repos/ubuntu2204/x86_64"
    shutil.copy(key_override or flat / "3bf863cc.pub", nvidia_key)
    shutil.copy(key_override or repos.root / "hashicorp/gpg", hashicorp_key)
    (tmp_path / "etc/apt/sources.list.d/standin.sources").write_text(
        f"Types: deb\nURIs: {repos.nvidia_repo_url}/ubuntu2204/x86_64/\nSuites: /\nSigned-By: {nvidia_key}\n\n"
        f"Types: deb\nURIs: {repos.hashicorp_repo_url}\nSuites: bookworm\nComponents: main\n"
        f"Signed-By: {hashicorp_key}\n")
    return ["-o", f"Dir={tmp_path}", "-o", "Dir::State::status=/var/lib/dpkg/status", "-o", "Dir::Etc::main=/dev/null",
            "-o", "Dir::Etc::parts=/dev/null", "-o", "Debug::NoLocking=1",
            "-o", "APT::Sandbox::User=root"]  # the temp dirs are not readable by _apt


def apt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LC_ALL": "C"})


def test_index_lists_every_catalog_package_with_vendor_versions(served):
    repos, _ = served
    listed = {(p["Package"], p["Version"]) for p in repos.packages()}
    for version in catalog.DRIVER_VERSIONS:
        assert ("nvidia-driver-550-open", f"{version}-0ubuntu1") in listed
        assert ("nvidia-fabricmanager-550", f"{version}-1") in listed
    for version in catalog.CONSUL_VERSIONS:
        assert ("consul", version) in listed
    assert ("cuda-keyring", "1.1-1") in listed and ("datacenter-gpu-manager", "1:3.3.9") in listed
    fm = next(p for p in repos.packages() if p["Package"] == "nvidia-fabricmanager-550")
    assert "nvidia" not in fm.get("Depends", ""), "NVIDIA's FM package does not depend on the driver"
    driver = next(p for p in repos.packages()
                  if p["Package"] == "nvidia-driver-550-open" and p["Version"].startswith("550.90.07"))
    assert "nvidia-utils-550 (= 550.90.07-0ubuntu1)" in driver["Depends"]


def test_apt_verifies_the_signature_and_resolves_pinned_versions(served, tmp_path):
    repos, _ = served
    options = apt_root(tmp_path, repos)
    update = apt("apt-get", *options, "update")
    assert update.returncode == 0 and "NO_PUBKEY" not in update.stderr and "W:" not in update.stderr, update.stderr
    plan = apt("apt-get", *options, "-s", "install", "nvidia-driver-550-open=550.127.08-0ubuntu1",
               "nvidia-fabricmanager-550=550.127.08-1", "libnccl-dev=2.21.5-1+cuda12.4", "consul=1.20.1-1")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "Inst nvidia-utils-550 (550.127.08-0ubuntu1" in plan.stdout
    assert "Inst consul (1.20.1-1 HashiCorp:bookworm" in plan.stdout
    skew = apt("apt-get", *options, "-s", "install", "nvidia-driver-550-open=550.127.08-0ubuntu1",
               "nvidia-fabricmanager-550=550.90.07-1")
    assert skew.returncode == 0, "apt installs a skewed driver/FM pair, as on a real host"


def test_the_role_s_dcgm_specs_resolve_with_nscq_at_the_driver_version_and_the_host_engine_unit(served, tmp_path):
    """What nvidia_stack installs for preflight's `dcgmi diag`: DCGM under its real name and unit, and NSCQ
    (DCGM's NVSwitch library) at exactly the driver's version."""
    repos, _ = served
    defaults = yaml.safe_load((ROOT / "roles/nvidia_stack/defaults/main.yml").read_text())
    options = apt_root(tmp_path, repos)
    assert apt("apt-get", *options, "update").returncode == 0
    plan = apt("apt-get", *options, "-s", "install", *defaults["nvidia_stack_dcgm_packages"],
               f"libnvidia-nscq-550={defaults['nvidia_stack_driver_version']}-*")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "Inst datacenter-gpu-manager (1:3.3.9" in plan.stdout
    assert f"Inst libnvidia-nscq-550 ({defaults['nvidia_stack_driver_version']}-1" in plan.stdout
    dcgm = next(p for p in repos.packages() if p["Package"] == "datacenter-gpu-manager")
    unpacked = tmp_path / "dcgm"
    subprocess.run(["dpkg-deb", "-x", str(repos.root / "nvidia/compute/cuda/repos/ubuntu2204/x86_64" /
                                         dcgm["Filename"]), str(unpacked)], check=True)
    unit = (unpacked / "usr/lib/systemd/system/nvidia-dcgm.service").read_text()
    assert "ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm" in unit
    assert (unpacked / "usr/bin/dcgmi").is_file()


def test_apt_rejects_a_repository_signed_by_another_key(served, tmp_path):
    repos, _ = served
    other = build_repositories(tmp_path / "other", repos.base_url + "/other")
    assert other.fingerprint != repos.fingerprint
    options = apt_root(tmp_path / "apt", repos, key_override=other.root / "hashicorp/gpg")
    update = apt("apt-get", *options, "update")
    assert "NO_PUBKEY" in update.stderr or "not signed" in update.stderr, update.stderr


def test_a_tampered_index_fails_apt(served, tmp_path):
    repos, _ = served
    copy = tmp_path / "copy"
    shutil.copytree(repos.root, copy, ignore=shutil.ignore_patterns(".gnupg"))
    packages = copy / "hashicorp/dists/bookworm/main/binary-amd64/Packages"
    packages.write_text(packages.read_text().replace("Version: 1.20.1-1", "Version: 9.9.9-1"))
    (packages.parent / "Packages.gz").unlink()
    with serve(copy, "127.0.9.253") as url:
        tampered = dataclasses.replace(repos, root=copy, base_url=url)
        options = apt_root(tmp_path / "apt", tampered)
        update = apt("apt-get", *options, "update")
    assert "Hash Sum mismatch" in update.stderr or "File has unexpected size" in update.stderr, update.stderr


def test_packages_carry_the_vendor_unit_files(served, tmp_path):
    repos, _ = served
    flat = repos.root / "nvidia/compute/cuda/repos/ubuntu2204/x86_64"

    def extract(deb: Path, member: str) -> str:
        out = tmp_path / deb.stem
        subprocess.run(["dpkg-deb", "-x", str(deb), str(out)], check=True)
        return (out / member.lstrip("/")).read_text()

    unit = extract(flat / "nvidia-compute-utils-550_550.127.08-0ubuntu1_amd64.deb",
                   "/lib/systemd/system/nvidia-persistenced.service")
    assert "--no-persistence-mode" in unit, "Ubuntu's unit starts the daemon without persistence mode"
    consul = repos.root / "hashicorp/pool/main/c/consul/consul_1.20.1-1_amd64.deb"
    assert "Type=notify" in extract(consul, "/usr/lib/systemd/system/consul.service")
    conffiles = subprocess.run(["dpkg-deb", "-I", str(consul), "conffiles"], capture_output=True, text=True).stdout
    assert "/etc/consul.d/consul.hcl" in conffiles
    keyring_list = extract(flat / "cuda-keyring_1.1-1_all.deb", "/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list")
    # NVIDIA's server, not the one the deb came from: a role that leaves it fails apt on a mirrored site
    assert keyring_list == ("deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
                            "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/ /\n")


def test_an_unchanged_recipe_reuses_the_build_and_a_changed_one_rebuilds(served, tmp_path):
    # Deeper than a Unix socket path may be (107 bytes): gpg-agent's socket must not live in the build tree.
    root = tmp_path / ("d" * 100) / "r"
    first = build_repositories(root, "http://127.0.9.254:1")
    marker = first.root / "hashicorp/gpg"
    stamp = marker.stat().st_mtime_ns
    again = build_repositories(root, "http://127.0.9.254:1")
    assert again.fingerprint == first.fingerprint and marker.stat().st_mtime_ns == stamp
    assert again.mirror_fingerprint == first.mirror_fingerprint != first.fingerprint
    moved = build_repositories(root, "http://127.0.9.254:2")
    assert moved.fingerprint != first.fingerprint
    assert not (root / ".gnupg").exists()  # the throwaway secret key is gone with the build


def test_the_server_hides_dot_paths_and_listings_and_refuses_other_addresses(served):
    repos, url = served
    for path in ("/.gnupg/pubring.kbx", "/.recipe", "/hashicorp/"):
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(url + path, timeout=5)
        assert denied.value.code == 404
    assert urllib.request.urlopen(url + "/hashicorp/gpg", timeout=5).read().startswith(b"-----BEGIN PGP")
    with pytest.raises(ValueError, match="only loopback"):
        make_server(repos.root, "0.0.0.0", 0)


def test_fabric_manager_reports_its_version(tmp_path):
    script = tmp_path / "nv-fabricmanager"
    script.write_text(catalog.FABRICMANAGER.format(version="550.127.08", loaded_module=catalog.LOADED_MODULE))
    script.chmod(0o755)
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert version.stdout.strip() == "Fabric Manager version is : 550.127.08"


def test_hcl_reader_reads_what_the_consul_role_renders():
    text = """# Ansible managed
datacenter = "dc1"
node_name  = "r01n01"
server     = true
bootstrap_expect = 3
ui_config {
  enabled = true
}
retry_join = ["127.0.1.11", "127.0.1.12"]
/* block comment */
acl {
  enabled = true  // inline comment
  tokens {
    agent = "s3cr\\"et"
  }
}
ports { http = 8600 }
service "web" { port = 80 }
"""
    config = parse_hcl(text)
    assert config["server"] is True and config["bootstrap_expect"] == 3
    assert config["retry_join"] == ["127.0.1.11", "127.0.1.12"]
    assert config["acl"]["tokens"]["agent"] == 's3cr"et'
    assert config["ports"] == {"http": 8600} and config["service"] == {"web": {"port": 80}}
    with pytest.raises(ConfigError, match=r"consul.hcl:2: expected a value"):
        parse_hcl('a = 1\nb = }\n', "consul.hcl")


def test_consul_standin_agent_serves_notifies_systemd_and_stops_on_sigterm(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.9.252", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "consul.d"
    config.mkdir()
    (config / "consul.hcl").write_text(f'data_dir = "{tmp_path / "data"}"\nclient_addr = "127.0.9.252"\n'
                                       f'bind_addr = "127.0.9.252"\nserver = true\nui_config {{ enabled = true }}\n'
                                       f'ports {{\n  http = {port}\n  server = {port + 1}\n}}\n')
    notify_path = tmp_path / "notify"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(20)
    env = {**os.environ, "NOTIFY_SOCKET": str(notify_path), "PYTHONPATH": str(ROOT)}
    agent = subprocess.Popen([sys.executable, str(ROOT / "sim/aptrepo/consul_standin.py"), "agent",
                              f"-config-dir={config}"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert notify.recv(64) == b"READY=1"
        leader = json.loads(urllib.request.urlopen(f"http://127.0.9.252:{port}/v1/status/leader", timeout=5).read())
        assert leader
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=20) == 0
        assert "does not act on: ui_config" in agent.stderr.read()
    finally:
        if agent.poll() is None:
            agent.kill()
        notify.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.9.252:{port}/v1/status/leader", timeout=1)
        except OSError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the stand-in agent still serves after SIGTERM")


# ------------------------------------------------------------- the driver stand-ins against the loaded module


def stand_in(tmp_path: Path, name: str, text: str) -> Path:
    script = tmp_path / name
    script.write_text(text)
    script.chmod(0o755)
    return script


def fake_root(tmp_path: Path, loaded: str | None, installed: str = "550.127.08") -> dict[str, str]:
    """A root whose kernel has ``loaded`` (None: no NVIDIA module) and whose dpkg has ``installed``: the
    environment the stand-ins run in."""
    root = tmp_path / "root"
    if loaded:
        (root / "sys/module/nvidia").mkdir(parents=True)
        (root / "sys/module/nvidia/version").write_text(loaded + "\n")
    root.mkdir(exist_ok=True)
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "dpkg-query").write_text(f"#!/bin/sh\necho {installed}-0ubuntu1\n")
    (fake / "dpkg-query").chmod(0o755)
    return {"PATH": f"{fake}:/usr/bin:/bin", "CLUSTERCTL_SIM_ROOT": str(root)}


def test_fabric_manager_refuses_a_loaded_module_of_another_version_even_with_matching_packages(tmp_path):
    """The real FM reads the loaded module's version: after an upgrade it refuses until the node reboots."""
    fm = stand_in(tmp_path, "nv-fabricmanager",
                  catalog.FABRICMANAGER.format(version="550.127.08", loaded_module=catalog.LOADED_MODULE))
    config = tmp_path / "fm.cfg"
    config.write_text(catalog.FABRICMANAGER_CFG)
    done = subprocess.run([str(fm), "-c", str(config)], capture_output=True, text=True,
                          env=fake_root(tmp_path, loaded="550.90.07", installed="550.127.08"))
    assert done.returncode == 1
    assert ("fabric manager NVIDIA GPU driver interface version 550.127.08 don't match with driver version "
            "550.90.07. Please update with matching NVIDIA driver package.") in done.stderr


def test_fabric_manager_starts_on_its_own_loaded_module(tmp_path):
    fm = stand_in(tmp_path, "nv-fabricmanager",
                  catalog.FABRICMANAGER.format(version="550.127.08", loaded_module=catalog.LOADED_MODULE))
    config = tmp_path / "fm.cfg"
    config.write_text(catalog.FABRICMANAGER_CFG)
    env = fake_root(tmp_path, loaded="550.127.08", installed="550.90.07")
    done = subprocess.run([str(fm), "-c", str(config)], capture_output=True, text=True, env=env)
    pid_file = Path(env["CLUSTERCTL_SIM_ROOT"]) / "var/run/nvidia-fabricmanager/nv-fabricmanager.pid"
    try:
        assert done.returncode == 0, done.stderr
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGTERM)


@pytest.mark.parametrize("loaded", [None, "550.90.07"])
def test_persistenced_fails_without_a_loaded_module_of_its_version(tmp_path, loaded):
    daemon = stand_in(tmp_path, "nvidia-persistenced",
                      catalog.PERSISTENCED.format(version="550.127.08", loaded_module=catalog.LOADED_MODULE))
    done = subprocess.run([str(daemon), "--user", "root", "--persistence-mode"], capture_output=True, text=True,
                          env=fake_root(tmp_path, loaded=loaded))
    assert done.returncode == 1
    assert "nvidia-persistenced failed to initialize. Check syslog for more details." in done.stderr


def dkms_postinst(tmp_path: Path, version: str) -> Path:
    package = next(p for p in catalog.nvidia_packages(b"key")
                   if p.name == f"nvidia-dkms-{catalog.DRIVER_BRANCH}-open" and p.version.startswith(version))
    assert package.postinst is not None
    return stand_in(tmp_path, "postinst", package.postinst)


def test_the_driver_builds_a_module_for_the_running_kernel_only_with_its_headers(tmp_path):
    """dkms_common.postinst: without /lib/modules/$(uname -r)/build no module for the running kernel, only a
    notice, and the install succeeds; the module the replaced version built is gone either way."""
    kernel = os.uname().release
    env = fake_root(tmp_path, loaded="550.90.07")
    modules = Path(env["CLUSTERCTL_SIM_ROOT"]) / "lib/modules" / kernel
    (modules / "updates/dkms").mkdir(parents=True)
    (modules / "updates/dkms/nvidia.ko").write_text("550.90.07\n")
    postinst = dkms_postinst(tmp_path, "550.127.08")
    done = subprocess.run([str(postinst), "configure"], capture_output=True, text=True, env=env)
    assert done.returncode == 0
    assert (f"Module build for kernel {kernel} was skipped since the\n"
            "kernel headers for this kernel do not seem to be installed.") in done.stdout
    assert not (modules / "updates/dkms/nvidia.ko").exists()
    (modules / "build").mkdir()
    again = subprocess.run([str(postinst), "configure"], capture_output=True, text=True, env=env)
    assert again.returncode == 0
    assert (modules / "updates/dkms/nvidia.ko").read_text().strip() == "550.127.08"


def test_the_driver_metapackage_pulls_the_dkms_package_and_the_repo_has_the_running_kernel_s_headers():
    packages = catalog.nvidia_packages(b"key")
    headless = next(p for p in packages if p.name == f"nvidia-headless-{catalog.DRIVER_BRANCH}-open")
    assert any(d.startswith(f"nvidia-dkms-{catalog.DRIVER_BRANCH}-open ") for d in headless.depends)
    assert f"linux-headers-{os.uname().release}" in {p.name for p in packages}
