"""Simulated hosts: GPU servers that Ansible, preflight and the agent can work on, on one CI machine.

How to use::

    clusterctl virtual create DIR --nodes 32 --racks 4 [--gpu h200-sxm] [--fabric ib|roce|mixed] [--faults none]
    clusterctl virtual up DIR        # (re)creates every host; runs `down` first
    clusterctl virtual status DIR    # which hosts are up, with which faults
    clusterctl virtual down DIR      # unmounts everything, ends the hosts' namespaces and processes

Design (see :mod:`sim.hosts.namespaces`): each host is a persistent mount + UTS namespace pinned to
files under ``DIR/.sim/ns`` (a private tmpfs while up). Inside, /etc, /usr/local, /opt and /var are
copy-on-write overlays, /usr and /boot are read-only, /run is a tmpfs, simulated /sys subtrees and
/proc/{cpuinfo,meminfo,cmdline} are mounted over the real ones, /sys and /proc/sys are read-only and the
hostname is the host's. Two wrappers per host, ``DIR/.sim/<host>/python`` (``ansible_python_interpreter``)
and ``DIR/.sim/<host>/run`` (``clusterctl_exec_prefix``), enter the namespaces with CAP_SYS_MODULE,
CAP_SYS_BOOT and CAP_SYS_TIME dropped and ``SYSTEMD_OFFLINE=1``.

What a host looks like comes from its hardware description (:mod:`sim.hosts.hardware`: defaults per
GPU generation, ``sim_hardware`` overrides, the model's ``gpu_count``/``gpu_numa_nodes``/``rdma_nics``),
with ``sim_faults`` applied (:mod:`sim.hosts.faults`). The simulated trees come from
:mod:`sim.hosts.sysfs`; the stub tools (:mod:`sim.hosts.stubs`: nvidia-smi, ibstat, ibping,
ib_write_lat/bw, all_reduce_perf, chronyc, mlnx_qos, lscpu, numactl, cpupower, dmesg, journalctl,
systemctl show/cat, ofed_info, nv-fabricmanager) print the real tools' formats from it and log every call.
"""
