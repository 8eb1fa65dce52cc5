"""``preflight --release``: take the IUs of every node that passed out of maintenance, after the run.

The runner only judges; releasing changes the cluster, so it is a separate step the preflight command calls
with the runner's outcome (a library user who runs checks never releases by accident). For each node whose
results all passed (``runner.node_passed``, ``--strict`` counting WARN as failing), ``consul.release``
writes each IU's release marker (what the consul_agent role reads to stop putting it back into maintenance)
and clears its maintenance on the node's agent. A node whose Consul call fails gets one ERROR result
(check ``consul``, code ``RELEASE_FAILED``) naming why; the other nodes are still released.
"""

from __future__ import annotations

from collections.abc import Iterable

from cluster.model import Node
from preflight import consul
from preflight.result import CheckResult, Verdict
from preflight.runner import RunOutcome, node_passed


def release_passed(nodes: Iterable[Node], outcome: RunOutcome, strict: bool = False) -> dict[str, list[str]]:
    """Release the nodes that passed; returns node -> IU ids taken out of maintenance (also stored in
    ``outcome.released``). Failures are added to ``outcome.results`` in the runner's order."""
    released: dict[str, list[str]] = {}
    failed: list[CheckResult] = []
    for node in nodes:
        if not node_passed([r for r in outcome.results if r.node == node.name], strict):
            continue
        try:
            released[node.name] = consul.release(node)
        except consul.ConsulUnavailable as exc:
            failed.append(_release_failed(node, str(exc)))
        # Anything else (a token file that cannot be read, a bug) is this node's failure too: the other nodes
        # are still released, and the run's files are still written after this (the command writes them next).
        except Exception as exc:  # noqa: BLE001 - reported as the node's ERROR, never lost
            failed.append(_release_failed(node, f"{type(exc).__name__}: {exc}"))
    if failed:
        order = {name: i for i, name in enumerate(outcome.checks)}
        outcome.results = sorted(outcome.results + failed,
                                 key=lambda r: (r.rack, r.node, order.get(r.check, 99), r.iu or ""))
    outcome.released = released
    return released


def _release_failed(node: Node, why: str) -> CheckResult:
    first = (why.splitlines() or [""])[0][:300]
    return CheckResult(node.rack, node.name, None, "consul", Verdict.ERROR, f"--release failed: {first}",
                       {"code": "RELEASE_FAILED"})
