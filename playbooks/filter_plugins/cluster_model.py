"""Expose the cluster model (``cluster.model.build_node``) to roles as the ``cluster_node`` filter.

Usage in a role::

    _inference_unit_node: "{{ inventory_hostname | cluster_node(hostvars[inventory_hostname]) }}"

Returns the node as JSON-friendly data::

    {"name": "r01n01", "address": "127.0.1.11", "rack": "r01", "gpu_model": "h100-sxm",
     "gpu_count": 8, "iu_size": 4, "gpu_numa_nodes": [0, 0, 0, 0, 1, 1, 1, 1], "numa_nodes": [0, 1],
     "nics": [{"device": "mlx5_0", "netdev": "ibp24s0", "port": 1, "link_layer": "infiniband", ...}],
     "ius": [{"id": "r01n01-iu0", "index": 0, "gpus": [0, 1, 2, 3], "cuda_visible_devices": "0,1,2,3",
              "numa_node": 0, "port": 8000, "nics": ["mlx5_0", "mlx5_1"],
              "netdevs": ["ibp24s0", "ibp41s0"]}, ...]}

There is no second implementation of the layout here: everything comes from ``build_node``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from cluster import model
    from cluster.inventory import MODEL_VARS
except ImportError:  # ansible-playbook run from a checkout whose venv lacks the editable install
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from cluster import model
    from cluster.inventory import MODEL_VARS


def _model_vars(hostvars: Any) -> dict[str, Any]:
    # Only the variables the model reads: touching every host variable would template (and decrypt)
    # values such as vault secrets that the layout never needs.
    wanted = {key: hostvars[key] for key in MODEL_VARS if key in hostvars}
    wanted["group_names"] = list(hostvars.get("group_names", []))
    return wanted


def cluster_node(hostname: str, hostvars: Any) -> dict[str, Any]:
    node = model.build_node(str(hostname), _model_vars(hostvars))
    netdev_of = {nic.device: nic.netdev for nic in node.nics}
    ius = []
    for iu in node.ius:
        data = iu.to_json()
        data["index"] = iu.index
        data["cuda_visible_devices"] = iu.cuda_visible_devices
        data["netdevs"] = [netdev_of[d] for d in iu.nics if netdev_of.get(d)]
        ius.append(data)
    return {
        "name": node.name,
        "address": node.address,
        "rack": node.rack,
        "gpu_model": node.gpu_model,
        "gpu_count": node.gpu_count,
        "iu_size": node.iu_size,
        "gpu_numa_nodes": list(node.gpu_numa_nodes),
        "numa_nodes": sorted({iu.numa_node for iu in node.ius if iu.numa_node is not None}),
        "nics": [nic.to_json() for nic in node.nics],
        "ius": ius,
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"cluster_node": cluster_node}
