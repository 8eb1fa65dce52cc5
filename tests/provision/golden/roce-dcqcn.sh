#!/bin/sh
# Ansible managed
# Lossless RoCE on this node's RoCE ports: ECN/DCQCN on priority 3 (notification
# point and reaction point), and trust DSCP + PFC on that priority where mlnx_qos exists.
# Run at boot by roce-dcqcn.service: these settings do not survive a reboot.
set -eu
PRIO=3
PFC=0,0,0,1,0,0,0,0
for IF in enp26s0np0 enp60s0np0 enp156s0np0 enp188s0np0; do
    for ROLE in roce_np roce_rp; do
        echo 1 > "/sys/class/net/$IF/ecn/$ROLE/enable/$PRIO"
    done
    if [ -x /usr/bin/mlnx_qos ]; then
        /usr/bin/mlnx_qos -i "$IF" --trust dscp --pfc "$PFC" > /dev/null
    fi
done
