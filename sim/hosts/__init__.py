"""Simulated hosts: GPU servers that Ansible, preflight and the agent can work on, on one CI machine.

How to use::

    clusterctl virtual create -i DIR --nodes 32 --racks 4 [--gpu h200-sxm] [--fabric ib|roce|mixed] [--faults none]
    clusterctl virtual up -i DIR     # boots a machine per host; runs `down` first (refused on provisioned
                                     # machines unless --reset); builds the image once;
                                     # serves the package sources on 127.0.255.1:8080 (sim.hosts.repos)
    clusterctl virtual status -i DIR # each machine's systemd state, address and faults
    clusterctl virtual down -i DIR   # stops every machine, removes their overlays (also after kill -9 of up)

Design (see :mod:`sim.hosts.machines` and :mod:`sim.hosts.image`): each host is a systemd-nspawn
machine booting a cached Debian 12 image (systemd, sshd, python3, sudo) through its own overlay, sharing
this machine's network namespace with its sshd on the host's ``ansible_host`` only. Ansible and preflight
reach it over SSH as ``deploy`` with sudo, with the inventory's key and known_hosts (``DIR/.sim/ssh``).

What a host looks like comes from its hardware description (:mod:`sim.hosts.hardware`: defaults per
GPU generation, ``sim_hardware`` overrides, the model's ``gpu_count``/``gpu_numa_nodes``/``rdma_nics``),
with ``sim_faults`` applied (:mod:`sim.hosts.faults`). The simulated trees come from
:mod:`sim.hosts.sysfs`; the stub tools (:mod:`sim.hosts.stubs`: nvidia-smi, ibstat, ibping,
ib_write_lat/bw, all_reduce_perf, chronyc, mlnx_qos, lscpu, numactl, cpupower, dmesg, journalctl,
systemctl show/cat, ofed_info, nv-fabricmanager, update-grub, sysctl --system, mokutil --sb-state) print the real tools' formats from it and log every call.
"""
