"""Preflight: gate nodes on topology, GPU health, fabric, NCCL, C-states, DCQCN, NUMA pinning and time.

Layout (each a small module):

- :mod:`preflight.parsers` - pure text -> dataclass parsers for the tools' outputs.
- :mod:`preflight.transport` - run argv lists on a node: over SSH (fabric, host keys verified), or
  locally with ``ansible_connection: local`` (preflight on the node itself).
- :mod:`preflight.profiles` - expected values per GPU SKU (YAML, every value cites its source).
- :mod:`preflight.checks` - one module per check: ``gather(ctx) -> facts`` (the only place that runs
  commands; outputs read by the parsers) and a pure ``evaluate(facts, profile, node) -> [CheckResult]``,
  each with stable fault codes (listed in its docstring and its ``codes``).
- :mod:`preflight.runner` - all nodes in parallel on a bounded pool, then the rack-wide checks.
- :mod:`preflight.report`, :mod:`preflight.history` - table, JSON, JUnit; saved runs and their diff.
- :mod:`preflight.consul` - the only module that talks to Consul (read IU services, --release).
"""
