"""Local, signed apt repositories of vendor stand-in packages for the virtual cluster.

What only NVIDIA or HashiCorp publish (cuda-keyring, the driver branch, Fabric Manager, NCCL, DCGM, consul)
cannot be fetched here. This package builds an honest stand-in of each vendor's repository: the real package
names, versions, dependencies, maintainer-script effects and systemd unit files, laid out and signed the way
the vendor serves them, with stub programs where the vendor ships binaries. The roles add these repositories
exactly as they add the vendor's; only the URL and key (inventory values) differ.

    from sim.aptrepo import build_repositories, serve
    repos = build_repositories(Path("/var/cache/clusterctl/aptrepo"), base_url="http://127.0.9.254:8080")
    with serve(repos.root, "127.0.9.254", 8080):
        ...  # nvidia: f"{base_url}/nvidia/compute/cuda/repos/ubuntu2204/x86_64/"  (flat, like NVIDIA's)
             # hashicorp: f"{base_url}/hashicorp"  (dists/<suite>/main, key at /hashicorp/gpg)

Modules: ``catalog`` (what the stand-in packages are), ``deb`` (one .deb with dpkg-deb), ``repo`` (index,
sign, lay out), ``serve`` (a loopback-only static HTTP server).
"""

from sim.aptrepo.repo import Repositories, build_repositories
from sim.aptrepo.serve import serve

__all__ = ["Repositories", "build_repositories", "serve"]
