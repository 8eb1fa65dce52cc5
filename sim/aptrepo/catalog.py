"""What the stand-in packages are: vendor names, versions, dependencies, files and unit files.

Every entry mirrors a package of NVIDIA's CUDA repository for Ubuntu 22.04
(https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/) or of HashiCorp's apt repository
(https://apt.releases.hashicorp.com), because those are the packages the roles install in production:

| package | versions | what the stand-in carries |
|---|---|---|
| cuda-keyring | 1.1-1 | `/usr/share/keyrings/cuda-archive-keyring.gpg` + `cuda-ubuntu2204-x86_64.list` naming NVIDIA's server, as NVIDIA's |
| nvidia-driver-550-open, nvidia-headless-550-open | 550.127.08-0ubuntu1, 550.90.07-0ubuntu1 | metapackages with Ubuntu's exact-version dependencies |
| nvidia-utils-550 | same | `/usr/bin/nvidia-smi` (the simulated hardware answers) |
| nvidia-compute-utils-550 | same | `/usr/bin/nvidia-persistenced` + Ubuntu's unit, which passes `--no-persistence-mode` |
| libnvidia-compute-550, nvidia-kernel-common-550, nvidia-kernel-source-550-open | same | marker libraries/sources |
| nvidia-dkms-550-open | same | postinst as dkms's: builds the module only with the running kernel's headers |
| nvidia-fabricmanager-550 | 550.127.08-1, 550.90.07-1 | `nv-fabricmanager` + NVIDIA's unit; refuses a loaded module of another version |
| libnvidia-nscq-550 | 550.127.08-1, 550.90.07-1 | `libnvidia-nscq.so.<version>` (DCGM's NVSwitch library; its version must be the driver's) |
| linux-headers-$(uname -r) | 1.0-0clusterctl1 | the `/lib/modules/<release>/build` link dkms looks for |
| cuda-toolkit-12-4 | 12.4.1-1 | `/usr/local/cuda-12.4` with `nvcc --version` and `version.json` |
| libnccl2, libnccl-dev | 2.21.5-1+cuda12.4, 2.20.5-1+cuda12.4 | `libnccl.so.2.x.y`, `nccl.h` with NCCL_MAJOR/MINOR/PATCH |
| datacenter-gpu-manager | 1:3.3.9 | `nv-hostengine`, `dcgmi` and DCGM's `nvidia-dcgm.service` |
| consul | 1.20.1-1, 1.19.2-1 | `/usr/bin/consul`, HashiCorp's `consul.service` (Type=notify), `/etc/consul.d/consul.hcl` |

Two driver / Fabric Manager versions exist so that version skew can be produced (a host with 550.90.07
preinstalled and FM pinned to 550.127.08). NVIDIA's Fabric Manager package does not depend on the driver
(NVIDIA/apt-packaging-fabric-manager, debian/templates/control.in: `Depends: ${misc:Depends}, libc6,
systemd-coredump`), so apt happily installs a skewed pair, exactly as on a real host.

How the driver stand-ins behave against the loaded kernel module, and the sources: README.md beside this file.

Where the vendor ships a hardware tool, the stand-in is a two-line launcher of the simulated host's stub
program (``SIM_TOOL``, provided by the machine: see sim/hosts); daemons are small POSIX shell programs that
check what the real daemon checks at start (versions, arguments) and then idle. What is simplified, and why:
- the module DKMS "builds" is a file holding its version (the machines share this machine's kernel; see
  sim/hosts/nvidia_module.py for how it is loaded at boot);
- cuda-toolkit-12-4 is one package (NVIDIA's pulls ~40 cuda-* packages; only the path and version matter to
  the roles and preflight);
- nv-hostengine does not listen on 127.0.0.1:5555: every machine shares this machine's network namespace,
  so one port would collide. It writes its pid to ``DCGM_HOSTENGINE_PID`` instead, and `dcgmi` answers from
  the simulated hardware while that process runs, else with dcgmi's own connection error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.aptrepo.kernel import (
    DKMS_POSTINST,
    DKMS_POSTRM,
    HEADERS_POSTINST,
    HEADERS_POSTRM,
    HEADERS_VERSION,
    KERNEL,
    LOADED_MODULE,
)
from sim.hosts.machine_paths import DCGM_HOSTENGINE_PID

ARCH = "amd64"
# The multi-call stub program every machine provides (sim/hosts binds it in); CLUSTERCTL_SIM_TOOL names the tool.
SIM_TOOL = "/usr/lib/clusterctl-sim/bin/clusterctl-sim-tool"

DRIVER_BRANCH = "550"
DRIVER_VERSIONS = ("550.127.08", "550.90.07")  # current pin first, then the older one for skew tests
NCCL_VERSIONS = ("2.21.5-1+cuda12.4", "2.20.5-1+cuda12.4")
CUDA_TOOLKIT = ("cuda-toolkit-12-4", "12.4.1-1", "12.4")
DCGM_VERSION = "1:3.3.9"
# What the real cuda-keyring 1.1-1 of the ubuntu2204/x86_64 repository writes into its .list.
KEYRING_REPO_URL = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/"
CONSUL_VERSIONS = ("1.20.1-1", "1.19.2-1")


@dataclass(frozen=True)
class PackageFile:
    path: str  # absolute path on the installed system
    content: str | bytes
    mode: int = 0o644


@dataclass(frozen=True)
class StandIn:
    """One binary package: control fields, files, conffiles and maintainer scripts."""

    repo: str  # "nvidia" or "hashicorp": which vendor repository serves it
    name: str
    version: str
    description: str
    maintainer: str
    homepage: str
    section: str = "multiverse/libs"
    architecture: str = ARCH
    depends: tuple[str, ...] = ()
    files: tuple[PackageFile, ...] = ()
    postinst: str | None = None
    postrm: str | None = None
    extra_fields: dict[str, str] = field(default_factory=dict)

    @property
    def filename(self) -> str:
        # Debian drops the epoch from file names (deb-version(7)).
        return f"{self.name}_{self.version.split(':', 1)[-1]}_{self.architecture}.deb"

    @property
    def conffiles(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files if f.path.startswith("/etc/"))


def sim_tool_launcher(tool: str, vendor_release: str, nvml: str | None = None) -> PackageFile:
    """``nvml``: the driver version of the user-space library the tool loads (NVML), which must match the
    loaded kernel module's."""
    library = f"CLUSTERCTL_SIM_NVML_VERSION={nvml} " if nvml else ""
    return PackageFile(
        f"/usr/bin/{tool}",
        f"#!/bin/sh\n# Stand-in for {tool} {vendor_release} (clusterctl virtual cluster): the simulated hardware answers.\n"
        f'{library}CLUSTERCTL_SIM_TOOL={tool} exec {SIM_TOOL} "$@"\n',
        0o755,
    )


_NVIDIA = {"maintainer": "NVIDIA CUDA Stand-in <cuda-standin@invalid>", "homepage": "https://developer.nvidia.com/cuda"}
_HASHICORP = {"maintainer": "HashiCorp Stand-in <consul-standin@invalid>", "homepage": "https://www.consul.io/"}

# Ubuntu's nvidia-compute-utils-<branch> unit (nvidia-graphics-drivers, debian/templates). It starts the daemon
# WITHOUT persistence mode: enabling the unit alone leaves persistence off, as on a real host.
PERSISTENCED_UNIT = """\
[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target
Before=systemd-backlight@backlight:nvidia_0.service

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""

# The daemon records the mode it runs in where the simulated nvidia-smi can read it.
PERSISTENCED = """\
#!/bin/sh
# Stand-in for nvidia-persistenced {version}: validates its arguments like the real daemon, forks, writes its pid
# file and records whether persistence mode is on (/var/run/nvidia-persistenced/persistence_mode). Like the real
# daemon it cannot initialize without a loaded NVIDIA kernel module of its own version.
set -eu
user=root mode=Enabled
while [ $# -gt 0 ]; do
  case "$1" in
    --user) user="$2"; shift ;;
    --user=*) user="${{1#--user=}}" ;;
    --no-persistence-mode) mode=Disabled ;;
    --persistence-mode) mode=Enabled ;;
    --verbose|-V) ;;
    --version) echo "nvidia-persistenced:  version {version}"; exit 0 ;;
    *) echo "nvidia-persistenced: Unrecognized option: $1" >&2; exit 1 ;;
  esac
  shift
done
id "$user" >/dev/null 2>&1 || {{ echo "nvidia-persistenced failed to initialize: unknown user '$user'" >&2; exit 1; }}
{loaded_module}if [ "$loaded" != "{version}" ]; then
  echo "nvidia-persistenced: NVIDIA kernel module ${{loaded:-not loaded}}, library {version}" >&2
  echo "nvidia-persistenced failed to initialize. Check syslog for more details." >&2
  exit 1
fi
run="${{CLUSTERCTL_SIM_ROOT:-}}/var/run/nvidia-persistenced"
mkdir -p "$run"
echo "$mode" > "$run/persistence_mode"
setsid sleep infinity </dev/null >/dev/null 2>&1 &
echo $! > "$run/nvidia-persistenced.pid"
echo "nvidia-persistenced: Started (persistence mode $mode, user $user)"
"""

# NVIDIA/apt-packaging-fabric-manager: nvidia-fabricmanager.service of the 550 branch.
FABRICMANAGER_UNIT = """\
[Unit]
Description=NVIDIA fabric manager service
After=network-online.target
Requires=network-online.target

[Service]
User=root
PrivateTmp=false
Type=forking
PIDFile=/var/run/nvidia-fabricmanager/nv-fabricmanager.pid
ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg

[Install]
WantedBy=multi-user.target
"""

# Fabric Manager compares itself with the LOADED kernel module (what /proc/driver/nvidia/version says), not with
# the installed packages: after a driver upgrade it refuses to start until the node reboots.
FABRICMANAGER = """\
#!/bin/sh
# Stand-in for NVIDIA Fabric Manager {version}: like the real daemon it refuses to run against a loaded kernel
# module of another version, then forks and writes its pid file.
set -eu
config=""
while [ $# -gt 0 ]; do
  case "$1" in
    -v|--version) echo "Fabric Manager version is : {version}"; exit 0 ;;
    -c|--config) config="$2"; shift ;;
    *) echo "nv-fabricmanager: unknown option $1" >&2; exit 1 ;;
  esac
  shift
done
[ -r "$config" ] || {{ echo "nv-fabricmanager: failed to open config file $config" >&2; exit 1; }}
{loaded_module}if [ "$loaded" != "{version}" ]; then
  echo "fabric manager NVIDIA GPU driver interface version {version} don't match with driver version $loaded." \\
       "Please update with matching NVIDIA driver package." >&2
  exit 1
fi
run="${{CLUSTERCTL_SIM_ROOT:-}}/var/run/nvidia-fabricmanager"
mkdir -p "$run"
setsid sleep infinity </dev/null >/dev/null 2>&1 &
echo $! > "$run/nv-fabricmanager.pid"
"""

FABRICMANAGER_CFG = """\
# fabricmanager.cfg (stand-in: the keys of NVIDIA's default file that matter on an HGX baseboard)
LOG_LEVEL=4
LOG_FILE_NAME=/var/log/fabricmanager.log
FABRIC_MODE=0
FABRIC_MODE_RESTART=0
STATE_FILE_NAME=/tmp/fabricmanager.state
FM_CMD_BIND_INTERFACE=127.0.0.1
FM_CMD_PORT_NUMBER=6666
"""

# DCGM's unit as packaged by NVIDIA (datacenter-gpu-manager, /usr/lib/systemd/system/nvidia-dcgm.service).
DCGM_UNIT = """\
[Unit]
Description=NVIDIA DCGM service
Wants=syslog.target

[Service]
User=root
PrivateTmp=false
ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm
Restart=on-abort

[Install]
WantedBy=multi-user.target
"""

NV_HOSTENGINE = """\
#!/bin/sh
# Stand-in for nv-hostengine (DCGM {version}): runs in the foreground with -n; does not listen (see sim.aptrepo.catalog).
set -eu
foreground=no
while [ $# -gt 0 ]; do
  case "$1" in
    -n|--no-daemon) foreground=yes ;;
    --service-account) id "$2" >/dev/null 2>&1 || {{ echo "nv-hostengine: unknown service account $2" >&2; exit 1; }}; shift ;;
    -v|--version) echo "Version : {version}"; exit 0 ;;
    *) echo "nv-hostengine: unknown option $1" >&2; exit 1 ;;
  esac
  shift
done
# Where the real one opens 127.0.0.1:5555, the stand-in records its pid: dcgmi reaches it while that lives.
if [ "$foreground" = yes ]; then echo $$ > {pid_file}; exec sleep infinity; fi
setsid sh -c 'echo $$ > {pid_file}; exec sleep infinity' </dev/null >/dev/null 2>&1 &
"""

# HashiCorp's consul.service from the consul deb (.release/linux/package/usr/lib/systemd/system/consul.service).
CONSUL_UNIT = """\
[Unit]
Description="HashiCorp Consul - A service mesh solution"
Documentation=https://www.consul.io/
Requires=network-online.target
After=network-online.target
ConditionFileNotEmpty=/etc/consul.d/consul.hcl

[Service]
EnvironmentFile=-/etc/consul.d/consul.env
User=consul
Group=consul
Type=notify
ExecStart=/usr/bin/consul agent -config-dir=/etc/consul.d/
ExecReload=/bin/kill --signal HUP $MAINPID
KillMode=process
KillSignal=SIGTERM
Restart=on-failure
LimitNOFILE=65536

[Install]
WantedBy=multi-user.target
"""

CONSUL_DEFAULT_HCL = """\
# Full configuration options can be found at https://developer.hashicorp.com/docs/agent/config

data_dir = "/opt/consul"
"""

# HashiCorp's postinst: a system user `consul` with home /etc/consul.d, and the data dir it owns.
CONSUL_POSTINST = """\
#!/bin/sh
set -e
if [ "$1" = configure ]; then
  getent group consul >/dev/null || groupadd --system consul
  id consul >/dev/null 2>&1 || useradd --system --gid consul --home /etc/consul.d --shell /bin/false consul
  mkdir -p /opt/consul
  chown -R consul:consul /opt/consul /etc/consul.d
fi
"""


def _system_user_postinst(user: str) -> str:
    return (
        "#!/bin/sh\nset -e\n"
        f'if [ "$1" = configure ]; then\n  id {user} >/dev/null 2>&1 || '
        f"useradd --system --home /nonexistent --no-create-home --shell /usr/sbin/nologin {user}\nfi\n"
    )


def _marker(path: str, what: str) -> PackageFile:
    return PackageFile(path, f"clusterctl stand-in: {what}\n")


def nvidia_packages(keyring: bytes) -> list[StandIn]:
    """NVIDIA's packages; ``keyring`` is the repository's public key (binary)."""
    packages = [
        StandIn(
            "nvidia", "cuda-keyring", "1.1-1", "GPG keyring for the CUDA repository", section="multiverse/devel",
            architecture="all", **_NVIDIA,
            files=(
                PackageFile("/usr/share/keyrings/cuda-archive-keyring.gpg", keyring),
                # NVIDIA's server, wherever the deb was fetched from: a mirror or the stand-in server is not
                # where the real keyring points apt (see README.md, "cuda-keyring's entry").
                PackageFile("/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list",
                            f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {KEYRING_REPO_URL} /\n"),
            ),
        )
    ]
    b = DRIVER_BRANCH
    for version in DRIVER_VERSIONS:
        pkg_version = f"{version}-0ubuntu1"
        exact = f"(= {pkg_version})"
        libs = "/usr/lib/x86_64-linux-gnu"
        packages += [
            StandIn("nvidia", f"nvidia-kernel-common-{b}", pkg_version, "Shared files used with the kernel module",
                    **_NVIDIA, files=(_marker(f"/usr/share/doc/nvidia-kernel-common-{b}/VERSION", version),)),
            StandIn("nvidia", f"nvidia-kernel-source-{b}-open", pkg_version, "NVIDIA kernel source package (open)",
                    **_NVIDIA, files=(_marker(f"/usr/src/nvidia-{version}/README", "open kernel module source"),)),
            StandIn("nvidia", f"libnvidia-compute-{b}", pkg_version, "NVIDIA libcompute package", **_NVIDIA,
                    files=(_marker(f"{libs}/libcuda.so.{version}", "libcuda"),
                           _marker(f"{libs}/libnvidia-ml.so.{version}", "NVML"))),
            StandIn("nvidia", f"nvidia-utils-{b}", pkg_version, "NVIDIA driver support binaries", **_NVIDIA,
                    depends=(f"libnvidia-compute-{b} {exact}",),
                    files=(sim_tool_launcher("nvidia-smi", version, nvml=version),)),
            StandIn("nvidia", f"nvidia-compute-utils-{b}", pkg_version, "NVIDIA compute utilities", **_NVIDIA,
                    depends=(f"libnvidia-compute-{b} {exact}",),
                    files=(PackageFile("/usr/bin/nvidia-persistenced",
                                       PERSISTENCED.format(version=version, loaded_module=LOADED_MODULE), 0o755),
                           PackageFile("/lib/systemd/system/nvidia-persistenced.service", PERSISTENCED_UNIT)),
                    postinst=_system_user_postinst("nvidia-persistenced")),
        ]
        packages.append(
            StandIn("nvidia", f"nvidia-dkms-{b}-open", pkg_version, "NVIDIA DKMS package (open kernel module)",
                    **_NVIDIA, depends=(f"nvidia-kernel-common-{b} {exact}", f"nvidia-kernel-source-{b}-open {exact}"),
                    postinst=DKMS_POSTINST.format(version=version), postrm=DKMS_POSTRM))
        driver_deps = tuple(f"{name} {exact}" for name in (
            f"nvidia-kernel-common-{b}", f"nvidia-kernel-source-{b}-open", f"nvidia-dkms-{b}-open",
            f"libnvidia-compute-{b}", f"nvidia-utils-{b}", f"nvidia-compute-utils-{b}"))
        packages += [
            StandIn("nvidia", f"nvidia-driver-{b}-open", pkg_version, "NVIDIA driver (open kernel) metapackage",
                    **_NVIDIA, depends=driver_deps),
            StandIn("nvidia", f"nvidia-headless-{b}-open", pkg_version, "NVIDIA headless metapackage (open kernel)",
                    **_NVIDIA, depends=driver_deps),
            # NVIDIA/apt-packaging-libnvidia-nscq: libnvidia-nscq-<branch>_<driver version>-1, which "must match
            # the NVIDIA driver installed"; no dependency on the driver, like Fabric Manager's.
            StandIn("nvidia", f"libnvidia-nscq-{b}", f"{version}-1", "NVSwitch Configuration and Query library",
                    **_NVIDIA, files=(_marker(f"{libs}/libnvidia-nscq.so.{version}", "NSCQ"),)),
            StandIn("nvidia", f"nvidia-fabricmanager-{b}", f"{version}-1", "Fabric Manager for NVSwitch based systems",
                    **_NVIDIA, depends=("libc6",),
                    files=(PackageFile("/usr/bin/nv-fabricmanager",
                                       FABRICMANAGER.format(version=version, loaded_module=LOADED_MODULE), 0o755),
                           PackageFile("/lib/systemd/system/nvidia-fabricmanager.service", FABRICMANAGER_UNIT),
                           PackageFile("/usr/share/nvidia/nvswitch/fabricmanager.cfg", FABRICMANAGER_CFG))),
        ]
    packages.append(StandIn(
        "nvidia", f"linux-headers-{KERNEL}", HEADERS_VERSION, f"Header files related to Linux kernel {KERNEL}",
        section="devel", **_NVIDIA,
        files=(_marker(f"/usr/src/linux-headers-{KERNEL}/Makefile", f"kernel headers of {KERNEL}"),),
        postinst=HEADERS_POSTINST.format(kernel=KERNEL), postrm=HEADERS_POSTRM.format(kernel=KERNEL)))
    name, version, cuda = CUDA_TOOLKIT
    packages.append(StandIn(
        "nvidia", name, version, f"CUDA Toolkit {cuda} meta-package", section="multiverse/devel", **_NVIDIA,
        files=(PackageFile(f"/usr/local/cuda-{cuda}/bin/nvcc",
                           "#!/bin/sh\n# Stand-in nvcc: prints its version only.\n"
                           "echo 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                           f"echo 'Cuda compilation tools, release {cuda}, V{version.split('-')[0]}'\n", 0o755),
               PackageFile(f"/usr/local/cuda-{cuda}/version.json",
                           f'{{"cuda": {{"name": "CUDA SDK", "version": "{version.split("-")[0]}"}}}}\n')),
    ))
    for nccl in NCCL_VERSIONS:
        major, minor, patch = nccl.split("-")[0].split(".")
        packages += [
            StandIn("nvidia", "libnccl2", nccl, "NVIDIA Collective Communication Library (NCCL) Runtime", **_NVIDIA,
                    files=(_marker(f"/usr/lib/x86_64-linux-gnu/libnccl.so.{major}.{minor}.{patch}", "libnccl"),)),
            StandIn("nvidia", "libnccl-dev", nccl, "NVIDIA Collective Communication Library (NCCL) Development Files",
                    **_NVIDIA, depends=(f"libnccl2 (= {nccl})",),
                    files=(PackageFile("/usr/include/nccl.h",
                                       f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n"
                                       f"#define NCCL_PATCH {patch}\n#define NCCL_SUFFIX \"\"\n"),)),
        ]
    dcgm = DCGM_VERSION.split(":")[-1]
    packages.append(StandIn(
        "nvidia", "datacenter-gpu-manager", DCGM_VERSION, "NVIDIA Datacenter GPU Management Tools", **_NVIDIA,
        files=(PackageFile("/usr/bin/nv-hostengine",
                           NV_HOSTENGINE.format(version=dcgm, pid_file=DCGM_HOSTENGINE_PID), 0o755),
               sim_tool_launcher("dcgmi", dcgm),
               PackageFile("/usr/lib/systemd/system/nvidia-dcgm.service", DCGM_UNIT)),
        postinst=_system_user_postinst("nvidia-dcgm"),
    ))
    return packages


def hashicorp_packages(consul_files: tuple[PackageFile, ...]) -> list[StandIn]:
    """HashiCorp's consul package; ``consul_files`` is the stand-in agent program (see sim.aptrepo.repo)."""
    return [
        StandIn(
            "hashicorp", "consul", version, "Consul is a distributed, highly available, and data center aware "
            "solution to connect and configure applications across dynamic, distributed infrastructure.",
            section="default", **_HASHICORP, depends=("python3",),
            files=(*consul_files,
                   PackageFile("/usr/lib/consul-standin/VERSION", version.split("-")[0] + "\n"),
                   PackageFile("/usr/lib/systemd/system/consul.service", CONSUL_UNIT),
                   PackageFile("/etc/consul.d/consul.hcl", CONSUL_DEFAULT_HCL),
                   PackageFile("/etc/consul.d/consul.env", "")),
            postinst=CONSUL_POSTINST,
        )
        for version in CONSUL_VERSIONS
    ]
