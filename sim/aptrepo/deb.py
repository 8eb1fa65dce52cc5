"""Build one binary package with dpkg-deb from a ``StandIn`` (control, conffiles, maintainer scripts, files)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from sim.aptrepo.catalog import StandIn


def control_text(package: StandIn) -> str:
    fields = {
        "Package": package.name,
        "Version": package.version,
        "Architecture": package.architecture,
        "Maintainer": package.maintainer,
        "Section": package.section,
        "Priority": "optional",
        "Homepage": package.homepage,
    }
    if package.depends:
        fields["Depends"] = ", ".join(package.depends)
    fields.update(package.extra_fields)
    fields["Description"] = package.description
    return "".join(f"{key}: {value}\n" for key, value in fields.items())


def build_deb(package: StandIn, out_dir: Path) -> Path:
    """Write ``out_dir/<name>_<version>_<arch>.deb``; files are owned by root (``--root-owner-group``)."""
    out = out_dir / package.filename
    with tempfile.TemporaryDirectory(prefix="standin-deb-") as tmp:
        root = Path(tmp)
        debian = root / "DEBIAN"
        debian.mkdir(mode=0o755)
        (debian / "control").write_text(control_text(package))
        if package.conffiles:
            (debian / "conffiles").write_text("".join(f"{path}\n" for path in package.conffiles))
        for script, body in (("postinst", package.postinst), ("postrm", package.postrm)):
            if body:
                (debian / script).write_text(body)
                (debian / script).chmod(0o755)
        for item in package.files:
            target = root / item.path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            for parent in [target.parent, *target.parent.parents]:
                if parent == root:
                    break
                parent.chmod(0o755)
            if isinstance(item.content, bytes):
                target.write_bytes(item.content)
            else:
                target.write_text(item.content)
            target.chmod(item.mode)
        done = subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"dpkg-deb failed for {package.name} {package.version}: {done.stderr.strip()}")
    return out
