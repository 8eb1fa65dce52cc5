"""Reader library for the edge scheduler (and ``clusterctl scores``).

    view = PoolView(dc=datacenter)                 # state: KV scores + Consul health + anomaly verdicts
    watcher = ConsulWatcher(view, ConsulIO(addr))  # rate-limited blocking queries keep it fresh
    watcher.start()
    ledger = EdgeLedger()
    choice = pick(view.snapshot(), ledger, now=time.time(), rng=random.Random())
    ledger.on_sent(choice.iu_id, now) ... ledger.on_done(choice.iu_id)

``pick`` is pure given its arguments (time and randomness are parameters), so a simulation drives it with a
simulated clock.
"""

from eas_agent.scheduler.anomaly import AnomalyDetector, Verdict
from eas_agent.scheduler.pick import Choice, EdgeLedger, pick
from eas_agent.scheduler.view import IUEntry, PoolView, Snapshot
from eas_agent.scheduler.watch import ConsulWatcher, ScoresPoller

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
