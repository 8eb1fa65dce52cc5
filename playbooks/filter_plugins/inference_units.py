"""The inference_unit role's one rule about what its IUs run, for its restart handler and its "Restart pending"
report alike: ``ius | inference_units_changed(written, env_dir, installed)`` is the IUs this run changed under
their running processes: every IU when vLLM itself was installed anew (``installed``, the registered pip
result: a running vLLM keeps the old version's modules loaded and imports the new one's lazily, a mix), when
the template unit or the IUs' shared API key file changed; else those whose environment file or NUMA drop-in
did. ``written`` is the role's registered ``clusterctl.infra.config_files`` results (their ``changes``: path
and action)."""

from __future__ import annotations

from typing import Any

TEMPLATE_UNIT = "/etc/systemd/system/vllm-iu@.service"
API_KEY_FILE = "api-key.env"  # every IU's VLLM_API_KEY


def inference_units_changed(ius: Any, written: Any, env_dir: str, installed: Any = None) -> list[Any]:
    changed = {change["path"] for result in written or [] for change in (result or {}).get("changes") or []}
    if (installed or {}).get("changed") or TEMPLATE_UNIT in changed or f"{env_dir}/{API_KEY_FILE}" in changed:
        return list(ius)
    return [iu for iu in ius if f"{env_dir}/{iu['index']}.env" in changed
            or f"/etc/systemd/system/vllm-iu@{iu['index']}.service.d/10-numa.conf" in changed]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"inference_units_changed": inference_units_changed}
