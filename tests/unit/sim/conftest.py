"""Fixtures of the simulators' unit tests (the Consul security warnings load inventories): in-process Ansible sees no vault settings but the test's own."""

from __future__ import annotations

from tests.helpers.cluster import no_ambient_vault  # noqa: F401  (autouse for every test below this folder)
