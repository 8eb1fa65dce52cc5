"""All Consul I/O of the agent, the reader library and the CLI (py-consul 1.8). Nothing else imports consul.

ACL tokens are passed explicitly on every call (py-consul sends none on some endpoints). Every failure is
raised as :class:`ConsulUnavailable` so callers handle one exception type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import consul
import requests

SERVICE_NAME = "vllm-iu"


class ConsulUnavailable(Exception):
    pass


def check_id_for(iu_id: str) -> str:
    return f"eas:{iu_id}"


@dataclass(frozen=True)
class IUService:
    """One IU's service registration (normally written by provisioning as a Consul service definition)."""

    iu_id: str
    node: str
    rack: str
    address: str
    port: int
    gpus: tuple[int, ...]
    numa_node: int | None


def _go_duration(seconds: float) -> str:
    return f"{int(round(seconds * 1000))}ms"


class ConsulIO:
    def __init__(
        self,
        address: str = "127.0.0.1:8500",
        *,
        token: str | None = None,
        scheme: str = "http",
        ca_file: str | None = None,
        timeout_s: float = 2.0,
        dc: str | None = None,
    ):
        host, port = address.rsplit(":", 1)
        self.token = token
        self.client = consul.Consul(
            host=host,
            port=int(port),
            token=token,
            scheme=scheme,
            verify=ca_file if ca_file else True,
            dc=dc,
            connections_timeout=timeout_s,
        )

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, token=self.token, **kwargs)
        except (consul.ConsulException, requests.RequestException, OSError, ValueError) as exc:
            raise ConsulUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc

    # -- KV -------------------------------------------------------------------------------------------
    def kv_read(self, key: str) -> tuple[int, str | None]:
        """(ModifyIndex, value) of ``key``; (0, None) when absent (CAS with 0 = create only)."""
        _, entry = self._call(f"GET kv/{key}", self.client.kv.get, key)
        if not entry:
            return 0, None
        value = entry.get("Value")
        return int(entry["ModifyIndex"]), value.decode() if isinstance(value, bytes) else value

    def kv_cas_put(self, key: str, value: str, cas: int) -> bool:
        ok = self._call(f"PUT kv/{key}", self.client.kv.put, key, value, cas=cas)
        return bool(ok)

    def kv_get_json(self, key: str) -> dict | None:
        _, entry = self._call(f"GET kv/{key}", self.client.kv.get, key)
        return json.loads(entry["Value"]) if entry and entry.get("Value") else None

    def kv_list(self, prefix: str, index: int | None = None, wait_s: float | None = None) -> tuple[int, list]:
        """Entries under ``prefix`` (a blocking query when ``index`` is given)."""
        wait = _go_duration(wait_s) if (index and wait_s) else None
        idx, entries = self._call(
            f"GET kv/{prefix}?recurse",
            self.client.kv.get,
            prefix,
            recurse=True,
            index=index or None,
            wait=wait,
        )
        return int(idx or 0), entries or []

    # -- health ---------------------------------------------------------------------------------------
    def health_service(
        self, index: int | None = None, wait_s: float | None = None, passing: bool = False
    ) -> tuple[int, list]:
        wait = _go_duration(wait_s) if (index and wait_s) else None
        idx, entries = self._call(
            f"GET health/service/{SERVICE_NAME}",
            self.client.health.service,
            SERVICE_NAME,
            index=index or None,
            wait=wait,
            passing=passing or None,
        )
        return int(idx or 0), entries or []

    # -- agent checks and services --------------------------------------------------------------------
    def register_ttl_check(self, iu_id: str, ttl_s: float) -> None:
        ok = self._call(
            f"register check {check_id_for(iu_id)}",
            self.client.agent.check.register,
            f"EAS load score {iu_id}",
            check=consul.Check.ttl(_go_duration(ttl_s)),
            check_id=check_id_for(iu_id),
            service_id=iu_id,
        )
        if not ok:
            raise ConsulUnavailable(
                f"register check {check_id_for(iu_id)}: refused (is service {iu_id} registered?)"
            )

    def update_ttl_check(self, iu_id: str, status: str, note: str = "") -> None:
        check = self.client.agent.check
        fn = {"passing": check.ttl_pass, "warning": check.ttl_warn, "critical": check.ttl_fail}[status]
        self._call(f"update check {check_id_for(iu_id)}", fn, check_id_for(iu_id), notes=note or None)

    def register_iu_service(self, service: IUService, http_check: bool = True) -> None:
        """Register one IU as Consul service ``vllm-iu`` (what the provisioning's definition file does)."""
        check = (
            consul.Check.http(f"http://{service.address}:{service.port}/health", "1s", timeout="1s")
            if http_check
            else None
        )
        self._call(
            f"register service {service.iu_id}",
            self.client.agent.service.register,
            SERVICE_NAME,
            service_id=service.iu_id,
            address=service.address,
            port=service.port,
            tags=[f"rack:{service.rack}", f"node:{service.node}"],
            meta={
                "gpus": ",".join(str(g) for g in service.gpus),
                "numa_node": "" if service.numa_node is None else str(service.numa_node),
                "node": service.node,
                "rack": service.rack,
            },
            check=check,
        )

    def service_maintenance(self, iu_id: str, enable: bool, reason: str = "") -> None:
        self._call(
            f"maintenance {iu_id}",
            self.client.agent.service.maintenance,
            iu_id,
            enable,
            reason=reason or None,
        )
