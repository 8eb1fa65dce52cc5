"""A simulated node: its IUs' HTTP servers, the file its stand-in NVML answers from and the agent config that
points at them.

Used by the end-to-end tests and the benchmarks::

    with SimulatedNode("r01n01", "r01", workdir, rates=[2.0, 8.0], consul_addr=addr) as node:
        node.register_services(ConsulIO(addr))   # what provisioning's service definitions do
        config = node.write_config(interval_s=0.1, heartbeat_s=0.5)
        Agent(config, gpu_backend=node.gpu_backend())              # in-process, or as a subprocess:
        subprocess.Popen(["eas-agent", "run", "--config", node.config_path], env=node.agent_env())
"""

from __future__ import annotations

from pathlib import Path

import yaml

from cluster.model import Node, build_node
from cluster.services import agent_ius
from consul_io import layout
from consul_io.client import ConsulIO
from eas_agent.collectors.gpu import NvmlBackend
from eas_agent.config import AgentConfig, load_config
from sim import nvml_standin
from sim.vllm.fake_gpu import fake_gpus, write_fake_gpu_file
from sim.vllm.registration import IUService, register_iu_service
from sim.vllm.server import SimulatedIU


class SimulatedNode:
    def __init__(
        self,
        name: str,
        rack: str,
        workdir: str | Path,
        *,
        rates: list[float],
        consul_addr: str,
        schema: str = "v1",
        gpus_per_iu: int = 4,
        host: str = "127.0.0.1",
        warmup_s: float = 30.0,
        seed: int = 0,
    ):
        self.name, self.rack, self.consul_addr = name, rack, consul_addr
        self.workdir = Path(workdir) / name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.gpus_per_iu = gpus_per_iu
        self.ius = [
            SimulatedIU(host, 0, schema=schema, arrival_rate=rate, seed=seed * 100 + i, warmup_s=warmup_s)
            for i, rate in enumerate(rates)
        ]
        self.gpu_file = self.workdir / "fake_gpus.json"
        write_fake_gpu_file(self.gpu_file, fake_gpus(gpus_per_iu * len(rates), utilization=80))

    def iu_id(self, index: int) -> str:
        return layout.iu_id(self.name, index)

    def config_data(self, **overrides) -> dict:
        data = {
            "node": self.name,
            "rack": self.rack,
            "datacenter": layout.DEFAULT_DATACENTER,
            "interval_s": 0.2,
            "heartbeat_s": 2.0,
            "profile": "drain",
            "listen": "127.0.0.1:0",
            "consul": {"address": self.consul_addr, "scheme": "http", "kv_prefix": layout.EAS_PREFIX},
            "gpu_backend": "nvml",
            "sysfs_root": str(self.workdir / "sys"),
            "ius": agent_ius(self.model_node()),
        }
        data.update(overrides)
        return data

    def model_node(self) -> Node:
        """This node in the cluster model (what an inventory would say: its IUs' GPUs and ports, IU N on
        NUMA node N % 2), so the agent config's IU list is the one provisioning renders."""
        ports = [int(iu.address.rsplit(":", 1)[1]) for iu in self.ius]
        gpu_count = self.gpus_per_iu * len(self.ius)
        return build_node(self.name, {
            "ansible_host": self.ius[0].address.rsplit(":", 1)[0], "rack": self.rack, "gpu_model": "h100-sxm",
            "gpu_count": gpu_count, "iu_size": self.gpus_per_iu, "iu_ports": ports,
            "gpu_numa_nodes": [g // self.gpus_per_iu % 2 for g in range(gpu_count)],
        })

    def write_config(self, **overrides) -> AgentConfig:
        path = self.workdir / "config.yml"
        path.write_text(yaml.safe_dump(self.config_data(**overrides), sort_keys=False))
        return load_config(path)

    @property
    def config_path(self) -> Path:
        return self.workdir / "config.yml"

    def gpu_backend(self) -> NvmlBackend:
        """The agent's NVML backend over a stand-in nvidia-ml-py reading this node's GPU file (in-process)."""
        return nvml_standin.nvml_backend(self.gpu_file)

    def agent_env(self) -> dict[str, str]:
        """The environment of an ``eas-agent run`` subprocess for this node: its ``import pynvml`` is the
        stand-in, reading this node's GPU file."""
        return nvml_standin.agent_env(self.gpu_file)

    def register_services(self, io: ConsulIO, http_check: bool = False) -> None:
        for i, iu in enumerate(self.ius):
            host, port = iu.address.rsplit(":", 1)
            register_iu_service(
                io,
                IUService(
                    self.iu_id(i),
                    self.name,
                    self.rack,
                    host,
                    int(port),
                    tuple(range(i * self.gpus_per_iu, (i + 1) * self.gpus_per_iu)),
                    i % 2,
                ),
                http_check=http_check,
            )

    def start(self) -> SimulatedNode:
        for iu in self.ius:
            iu.start()
        return self

    def stop(self) -> None:
        for iu in self.ius:
            iu.stop()

    def __enter__(self) -> SimulatedNode:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
