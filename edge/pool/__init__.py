"""The edge's reader of the pool: score bodies (eas_wire.scorebody) and Consul health folded into a view,
and the pick over it. ``clusterctl scores``, the demo and the benchmarks read the pool with it too; the agent
never imports it (tests/test_import_lint.py).

    view = PoolView(dc=datacenter)                 # state: KV scores + Consul health + anomaly verdicts
    watcher = ConsulWatcher(view, ConsulIO(addr))  # rate-limited blocking queries keep it fresh
    watcher.start()
    ledger = EdgeLedger()
    choice = pick(view.snapshot(), ledger, now=time.time(), rng=random.Random())
    ledger.on_sent(choice.iu_id, now) ... ledger.on_done(choice.iu_id)

``pick`` is pure given its arguments (time and randomness are parameters), so a simulation drives it with a
simulated clock.
"""

from edge.pool.anomaly import AnomalyDetector, Verdict
from edge.pool.pick import Choice, EdgeLedger, pick
from edge.pool.view import IUEntry, PoolView, Snapshot
from edge.pool.watch import ConsulWatcher, ScoresPoller

__all__ = [
    "AnomalyDetector",
    "Choice",
    "ConsulWatcher",
    "EdgeLedger",
    "IUEntry",
    "PoolView",
    "ScoresPoller",
    "Snapshot",
    "Verdict",
    "pick",
]
