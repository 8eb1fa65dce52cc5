"""An in-memory Consul for the publisher: the KV's CAS semantics, no HTTP.

For simulated-time benchmarks (bench/routesim, bench/consul_load.py) and unit tests; the publisher takes any
``eas_agent.publisher.ScoreStore`` and gets ``consul_io.client.ConsulIO`` in production.
"""

from __future__ import annotations

from consul_io.client import ConsulUnavailable


class MemoryStore:
    """In-memory ScoreStore with Consul's CAS semantics, for simulated-time benchmarks and unit tests."""

    def __init__(self):
        self.kv: dict[str, tuple[int, str]] = {}
        self.index = 0
        self.writes = 0
        self.available = True

    def _up(self) -> None:
        if not self.available:
            raise ConsulUnavailable("memory store marked unavailable")

    def kv_read(self, key: str) -> tuple[int, str | None]:
        self._up()
        return self.kv.get(key, (0, None))

    def kv_cas_write(self, key: str, value: str, cas: int) -> int | None:
        self._up()
        current = self.kv[key][0] if key in self.kv else 0
        if cas != current:
            return None
        self.index += 1
        self.kv[key] = (self.index, value)
        self.writes += 1
        return self.index
