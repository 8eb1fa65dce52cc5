"""Lay out, index and sign the stand-in repositories the way each vendor serves its own.

    <root>/nvidia/compute/cuda/repos/ubuntu2204/x86_64/   flat repository (``deb URL /``), like NVIDIA's:
        *.deb, Packages, Packages.gz, Release, Release.gpg, InRelease, 3bf863cc.pub (armored key, NVIDIA's name)
    <root>/hashicorp/                                      dists/<suite>/main/binary-amd64/Packages(.gz),
        dists/<suite>/{Release,Release.gpg,InRelease}, pool/main/c/consul/*.deb, gpg (armored key, HashiCorp's URL)

    <root>/site-mirror/{nvidia,hashicorp}/...              the same trees re-signed with another key, as a site's
        mirror publishes them (aptly publish, Pulp, Artifactory sign the Release files with the site's key), and
        key.asc, that key (a site hands it to its hosts out of band; the roles' *_mirror_key variables)

One throwaway ed25519 key signs both vendors' trees, another the site mirror's (their GNUPGHOME is a short-lived
0700 temp dir, deleted after the build). A build is
keyed by its recipe (the catalog, the consul stand-in's sources and the URL it is served at): an
unchanged recipe reuses the tree, a changed one rebuilds it; concurrent builders serialize on a lock file.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import devconsul
from sim.aptrepo import catalog
from sim.aptrepo.catalog import PackageFile, StandIn
from sim.aptrepo.deb import build_deb, control_text
from sim.hosts import machine_paths

NVIDIA_PATH = "nvidia/compute/cuda/repos"
NVIDIA_DISTRO, NVIDIA_ARCH = "ubuntu2204", "x86_64"
HASHICORP_PATH = "hashicorp"
HASHICORP_SUITES = ("jammy", "noble", "bookworm")
KEY_UID = "clusterctl stand-in apt repositories (throwaway) <aptrepo@clusterctl.invalid>"
MIRROR_KEY_UID = "clusterctl stand-in site mirror (throwaway) <site-mirror@clusterctl.invalid>"
SITE_MIRROR_PATH = "site-mirror"
CONSUL_STANDIN_DIR = "/usr/lib/consul-standin"
RECIPE_FILE = ".recipe"


@dataclass(frozen=True)
class Repositories:
    root: Path
    base_url: str
    fingerprint: str
    mirror_fingerprint: str

    @property
    def nvidia_repo_url(self) -> str:
        """The value for ``nvidia_stack_repo_url`` (the role appends /<distro>/<arch>/)."""
        return f"{self.base_url}/{NVIDIA_PATH}"

    @property
    def hashicorp_repo_url(self) -> str:
        """The value for ``consul_agent_repo_url`` (the role appends nothing; the key is at <url>/gpg)."""
        return f"{self.base_url}/{HASHICORP_PATH}"

    def mirror_url(self, repo_url: str) -> str:
        """``repo_url`` (``nvidia_repo_url``, ``hashicorp_repo_url``) of the re-signed copy: trusted with
        ``mirror_key`` (the roles' ``nvidia_stack_mirror_key``, ``consul_agent_mirror_key``)."""
        return f"{self.base_url}/{SITE_MIRROR_PATH}{repo_url.removeprefix(self.base_url)}"

    @property
    def mirror_key(self) -> Path:
        """The re-signed copy's key, armored (fingerprint ``mirror_fingerprint``)."""
        return self.root / SITE_MIRROR_PATH / "key.asc"

    def packages(self) -> list[dict[str, str]]:
        """Every package of both repositories as its index lists it (Package, Version, Filename, ...)."""
        found = []
        for index in sorted(self.root.rglob("Packages")):
            for stanza in index.read_text().split("\n\n"):
                fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line)
                if fields:
                    found.append(fields)
        return found


def consul_standin_files() -> tuple[PackageFile, ...]:
    """/usr/bin/consul and the devconsul sources it runs (stdlib only, so the machine's python3 runs it)."""
    source_dir = Path(devconsul.__file__).parent
    files = [PackageFile(f"{CONSUL_STANDIN_DIR}/devconsul/{path.name}", path.read_text())
             for path in sorted(source_dir.glob("*.py"))]
    launcher = (Path(__file__).parent / "consul_standin.py").read_text()
    files.append(PackageFile("/usr/bin/consul", launcher.replace("#!/usr/bin/env python3", "#!/usr/bin/python3", 1),
                             0o755))
    return tuple(files)


def recipe(base_url: str) -> str:
    """A digest of everything that decides the built tree."""
    digest = hashlib.sha256(base_url.encode())
    for path in [*sorted(Path(__file__).parent.glob("*.py")), Path(machine_paths.__file__)]:
        digest.update(path.name.encode() + path.read_bytes())
    for item in consul_standin_files():
        digest.update(item.path.encode() + (item.content.encode() if isinstance(item.content, str) else item.content))
    return digest.hexdigest()


def build_repositories(dest: Path, base_url: str) -> Repositories:
    """Build (or reuse) the signed repositories under ``dest`` for clients reaching them at ``base_url``."""
    base_url = base_url.rstrip("/")
    want = recipe(base_url)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        recorded = dest / RECIPE_FILE
        if recorded.is_file() and json.loads(recorded.read_text())["recipe"] == want:
            built = json.loads(recorded.read_text())
            return Repositories(dest, base_url, built["fingerprint"], built["mirror_fingerprint"])
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
        try:
            fingerprint, mirror_fingerprint = _build(staging)
            (staging / RECIPE_FILE).write_text(json.dumps(
                {"recipe": want, "fingerprint": fingerprint, "mirror_fingerprint": mirror_fingerprint}))
            if dest.exists():
                shutil.rmtree(dest)
            staging.rename(dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        os.chmod(dest, 0o755)
        return Repositories(dest, base_url, fingerprint, mirror_fingerprint)


@dataclass(frozen=True)
class _Layout:
    """Where one vendor's repository keeps its packages, indexes, Release files and key, all below ``path``."""

    path: str  # below the root
    pool: str  # the .debs
    scan: str  # what the indexes list (their Filename fields are relative to ``path``)
    dists: tuple[tuple[str, str, dict[str, str]], ...]  # (Release folder, its Packages folder, Release fields)
    key: str  # the armored key, under the vendor's name for it


NVIDIA_LAYOUT = _Layout(f"{NVIDIA_PATH}/{NVIDIA_DISTRO}/{NVIDIA_ARCH}", ".", ".", (
    (".", ".", {"Origin": "NVIDIA", "Label": "NVIDIA CUDA", "Architectures": "amd64 all"}),), "3bf863cc.pub")
HASHICORP_LAYOUT = _Layout(HASHICORP_PATH, "pool/main/c/consul", "pool", tuple(
    (f"dists/{suite}", f"dists/{suite}/main/binary-amd64",
     {"Origin": "Artifactory", "Label": "HashiCorp", "Suite": suite, "Codename": suite, "Components": "main",
      "Architectures": "amd64"}) for suite in HASHICORP_SUITES), "gpg")
# The folders a site mirror copies: each vendor's top folder (NVIDIA's repository sits deep below its own).
VENDOR_TREES = tuple(dict.fromkeys(layout.path.split("/")[0] for layout in (NVIDIA_LAYOUT, HASHICORP_LAYOUT)))


def _build(root: Path) -> tuple[str, str]:
    # Not under root: gpg-agent puts its socket in the homedir, and a Unix socket path has at most 107 bytes;
    # a deep build directory (a test's tmp_path under an xdist worker) left the agent unable to start.
    gnupg = Path(tempfile.mkdtemp(prefix="clusterctl-gpg-"))
    try:
        fingerprint = _make_key(gnupg, KEY_UID)
        armored = _gpg(gnupg, "--armor", "--export", fingerprint)
        binary = subprocess.run(["gpg", "--homedir", str(gnupg), "--batch", "--export", fingerprint],
                                check=True, capture_output=True).stdout
        for layout, packages in ((NVIDIA_LAYOUT, catalog.nvidia_packages(binary)),
                                 (HASHICORP_LAYOUT, catalog.hashicorp_packages(consul_standin_files()))):
            _lay_out(root / layout.path, layout, packages)
            _sign_releases(root / layout.path, gnupg, fingerprint)
            (root / layout.path / layout.key).write_text(armored)
        # The site mirror: both vendor trees again, the packages and indexes unchanged (hard links), every
        # Release signed again with the site's key: what a client that trusts only the vendor's key cannot verify.
        mirror = root / SITE_MIRROR_PATH
        mirror_fingerprint = _make_key(gnupg, MIRROR_KEY_UID)
        for vendor in VENDOR_TREES:
            shutil.copytree(root / vendor, mirror / vendor, copy_function=os.link)
        _sign_releases(mirror, gnupg, mirror_fingerprint)
        (mirror / "key.asc").write_text(_gpg(gnupg, "--armor", "--export", mirror_fingerprint))
        return fingerprint, mirror_fingerprint
    finally:
        # gpg starts an agent for the secret key; stop it so no process or socket outlives the build.
        subprocess.run(["gpgconf", "--homedir", str(gnupg), "--kill", "gpg-agent"], capture_output=True)
        shutil.rmtree(gnupg, ignore_errors=True)


def _lay_out(top: Path, layout: _Layout, packages: list[StandIn]) -> None:
    """The .debs, their indexes and the (unsigned) Release files of one vendor's repository."""
    pool = top / layout.pool
    pool.mkdir(parents=True)
    for package in packages:
        build_deb(package, pool)
    for release_dir, index_dir, fields in layout.dists:
        (top / index_dir).mkdir(parents=True, exist_ok=True)
        _index(top, top / index_dir, layout.scan)
        _release(top / release_dir, fields)


def _make_key(gnupg: Path, uid: str) -> str:
    _gpg(gnupg, "--passphrase", "", "--pinentry-mode", "loopback", "--quick-gen-key", uid, "ed25519", "sign",
         "never")
    listing = _gpg(gnupg, "--with-colons", "--list-secret-keys", f"={uid}")
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


def _gpg(gnupg: Path, *args: str) -> str:
    done = subprocess.run(["gpg", "--homedir", str(gnupg), "--batch", "--quiet", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"gpg {' '.join(args[:3])} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def _index(cwd: Path, out_dir: Path, scan: str) -> None:
    """Packages and Packages.gz for the .debs under ``cwd/scan``, Filename fields relative to ``cwd``."""
    done = subprocess.run(["apt-ftparchive", "packages", scan], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"apt-ftparchive packages {cwd / scan} failed: {done.stderr.strip()[-500:]}")
    (out_dir / "Packages").write_text(done.stdout)
    subprocess.run(["gzip", "-9nkf", str(out_dir / "Packages")], check=True)


def _release(directory: Path, fields: dict[str, str]) -> None:
    options = [f"-oAPT::FTPArchive::Release::{key}={value}" for key, value in fields.items()]
    done = subprocess.run(["apt-ftparchive", *options, "release", "."], cwd=directory, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"apt-ftparchive release {directory} failed: {done.stderr.strip()[-500:]}")
    (directory / "Release").write_text(done.stdout)


def _sign_releases(tree: Path, gnupg: Path, fingerprint: str) -> None:
    """InRelease and Release.gpg beside every Release under ``tree``. A copy's are hard links to the original's:
    replaced, never written through."""
    sign = ["--local-user", fingerprint, "--digest-algo", "SHA512"]
    for release in sorted(tree.rglob("Release")):
        for signature in ("InRelease", "Release.gpg"):
            (release.parent / signature).unlink(missing_ok=True)
        _gpg(gnupg, *sign, "--clearsign", "--output", str(release.parent / "InRelease"), str(release))
        _gpg(gnupg, *sign, "--armor", "--detach-sign", "--output", str(release.parent / "Release.gpg"), str(release))


__all__ = ["Repositories", "StandIn", "build_repositories", "control_text"]
