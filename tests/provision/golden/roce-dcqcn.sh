#!/bin/sh
# Ansible managed
# Lossless RoCE on this node's RoCE ports: PFC on priority 3, DSCP 26 (RoCE data, NCCL_IB_TC) trusted
# and mapped to it, ECN/DCQCN on it. Run at boot by roce-dcqcn.service: these settings do not
# survive a reboot (or an openibd restart). Two driver stacks, detected per port:
# - MLNX_OFED / DOCA-OFED: /sys/class/net/<if>/ecn/roce_{np,rp}/enable/<prio> and mlnx_qos (mlnx-tools);
# - inbox mlx5 + rdma-core: no ecn sysfs (DCQCN is on for the priorities in the firmware's
#   ROCE_CC_PRIO_MASK, set by the role through mlxconfig); PFC and DSCP trust through iproute2's dcb.
# Neither: fail, naming the port, rather than leave the fabric lossy without a word.
set -eu
PRIO=3
DSCP=26
PFC=0,0,0,1,0,0,0,0
MLNX_QOS=/usr/bin/mlnx_qos
fail() { echo "roce-dcqcn: $*" >&2; exit 1; }
for IF in enp26s0np0 enp60s0np0 enp156s0np0 enp188s0np0; do
    # The netdev may not be renamed/registered yet this early in boot: wait for it, then give up loudly.
    tries=0
    while [ ! -e "/sys/class/net/$IF" ]; do
        tries=$((tries + 1))
        [ "$tries" -le 30 ] || fail "$IF: no such network interface after 30 s"
        sleep 1
    done
    if [ -d "/sys/class/net/$IF/ecn/roce_np" ]; then
        [ -x "$MLNX_QOS" ] || fail "$IF: MLNX_OFED ecn sysfs present but $MLNX_QOS missing (mlnx-tools): cannot set PFC and DSCP trust"
        for ROLE in roce_np roce_rp; do
            echo 1 > "/sys/class/net/$IF/ecn/$ROLE/enable/$PRIO"
            [ "$(cat "/sys/class/net/$IF/ecn/$ROLE/enable/$PRIO")" = 1 ] || fail "$IF: $ROLE on priority $PRIO did not stay enabled"
        done
        "$MLNX_QOS" -i "$IF" --trust dscp --pfc "$PFC" > /dev/null
        # mlnx_qos --dscp2prio set,<dscp>,<prio>: DSCP trust alone maps DSCP>>3; make the mapping explicit.
        "$MLNX_QOS" -i "$IF" --dscp2prio "set,$DSCP,$PRIO" > /dev/null
    elif command -v dcb > /dev/null 2>&1; then
        dcb pfc set dev "$IF" prio-pfc all:off "$PRIO:on"
        # A DSCP app entry switches mlx5 to DSCP trust; replace keeps it idempotent across reruns.
        dcb app replace dev "$IF" dscp-prio "$DSCP:$PRIO"
    else
        fail "$IF: neither MLNX_OFED (/sys/class/net/$IF/ecn) nor iproute2's dcb is available: priority $PRIO stays lossy"
    fi
done
