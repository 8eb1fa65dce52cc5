"""An IU's revision: named by the role's variable, else composed from the node's inventory values only."""

from __future__ import annotations

import pytest

from cluster.services import iu_registration, iu_revision

pytestmark = pytest.mark.unit


def test_the_revision_is_composed_from_the_inventory_values():
    hostvars = {"inference_unit_vllm_version": "0.7.0", "inference_unit_served_model_name": "llama-3.1-70b",
                "nvidia_stack_driver_version": "550.127.08"}
    assert iu_revision(hostvars) == "vllm-0.7.0+llama-3.1-70b+driver-550.127.08"
    assert iu_revision({}) == "vllm-unknown+any+driver-unknown"  # the same in every play that renders it
    assert iu_revision(hostvars, "canary-2026-12") == "canary-2026-12"


def test_the_revision_is_registered_as_meta_only_when_there_is_one():
    with_revision = iu_registration("n1-iu0", "n1", "r1", "127.0.65.11", 8000, (0,), 0, revision="v2")
    assert with_revision["meta"]["revision"] == "v2"
    assert "revision" not in iu_registration("n1-iu0", "n1", "r1", "127.0.65.11", 8000, (0,), 0)["meta"]
