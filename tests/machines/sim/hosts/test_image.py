"""The machine image: keyed by its recipe, built once under a lock, a failed build shows its log's tail,
missing tools named with their package. debootstrap and chroot are replaced by scripts on PATH here (the
real build is what every machine test boots)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sim.hosts import image

pytestmark = pytest.mark.machines(order=4)


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """debootstrap that counts its runs and makes ROOT (or fails when FAIL_BUILD is set); chroot that logs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    count = tmp_path / "debootstrap-runs"
    (bin_dir / "debootstrap").write_text(
        "#!/bin/sh\n"
        f"echo run >> {count}\n"
        "echo 'I: Retrieving InRelease'\necho 'I: Installing core packages...'\n"
        'if [ -n "$FAIL_BUILD" ]; then echo "E: Couldn\'t download packages: systemd"; exit 1; fi\n'
        # ROOT is the next to last argument (debootstrap ... SUITE ROOT MIRROR); sleep: let the others queue
        'sleep 0.5\neval root=\\${$(($# - 1))}\nmkdir -p "$root/etc/apt"\n'
    )
    (bin_dir / "chroot").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("debootstrap", "chroot"):
        (bin_dir / tool).chmod(0o755)
    for tool in ("systemd-nspawn", "ssh", "ssh-keygen"):  # present (not run) on a machine without them
        if not any((Path(d) / tool).exists() for d in os.environ["PATH"].split(os.pathsep)):
            (bin_dir / tool).write_text("#!/bin/sh\nexit 1\n")
            (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CLUSTERCTL_IMAGE_CACHE", str(tmp_path / "cache"))
    return count


def test_the_recipe_names_the_image(monkeypatch):
    before = image.recipe_sha()
    monkeypatch.setattr(image, "PACKAGES", (*image.PACKAGES, "chrony"))
    assert image.recipe_sha() != before
    monkeypatch.setenv("CLUSTERCTL_DEBIAN_MIRROR", "http://127.0.0.1:3142/debian")
    assert "mirror=http://127.0.0.1:3142/debian" in image.recipe()


def test_concurrent_builders_build_once(fake_tools, tmp_path):
    lines: list[str] = []
    roots: list[Path] = []
    threads = [threading.Thread(target=lambda: roots.append(image.ensure(lines.append))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake_tools.read_text() == "run\n"  # one debootstrap for three builders
    assert len(set(roots)) == 1 and roots[0] == tmp_path / "cache" / image.recipe_sha() / "root"
    assert (roots[0] / "etc" / "apt" / "sources.list").read_text().startswith("deb http://")
    assert any("building the machine image" in line for line in lines)  # progress while building
    assert any("Installing core packages" in line for line in lines)
    lines.clear()
    assert image.ensure(lines.append) == roots[0] and lines == []  # cached: nothing printed


def test_a_failed_build_shows_the_end_of_its_log_and_leaves_nothing(fake_tools, tmp_path, monkeypatch):
    monkeypatch.setenv("FAIL_BUILD", "1")
    with pytest.raises(image.ImageError) as failed:
        image.ensure()
    message = str(failed.value)
    assert "`debootstrap` exited 1" in message and "E: Couldn't download packages: systemd" in message
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith((".lock", ".log"))] == []


def test_missing_tools_are_named_with_their_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(image.ImageError, match=r"systemd-nspawn \(apt-get install systemd-container\); "
                                               r"debootstrap \(apt-get install debootstrap\)"):
        image.ensure()


def test_a_symlinked_cache_is_refused(fake_tools, tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv("CLUSTERCTL_IMAGE_CACHE", str(tmp_path / "link"))
    with pytest.raises(image.ImageError, match="is a symlink"):
        image.ensure()
