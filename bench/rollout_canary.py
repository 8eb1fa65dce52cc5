"""Traffic rollouts end to end: a dev Consul, simulated vLLM IUs of two revisions, two real ``eas-edge``
processes, a client load through them and the rollout controller (operate/rollout_run.py) on the CI plan
(operate/rollouts/ci-short.yml: 20% / 50% / 100%, gates every second).

Cases: ``good`` (the canary is the same simulated engine: promotes through every step), ``slow`` (a canary
engine 2x slower: rolled back), ``jitter`` (one of the two canary IUs 2x slower: the spread of the canary IUs'
mean TTFT against stable's; rolled back), ``errors`` (a canary answering 500 to 2% of requests: rolled back), ``ecc`` (at
20%, a canary node's agent reports volatile uncorrectable ECC errors, in the body it publishes: rolled back),
``xid`` (at 20%, a canary node's GPU logs Xid 79: NVML's XID event, through the agent's own NVML backend over
the stand-in nvidia-ml-py and its GPU components, reaches the body: rolled back), ``abort`` (an operator's abort at the 50% step: every edge back on stable). Printed per case, each against its target:

- rollback: from the evidence (the moment the edges had counted ``min_requests`` answers on each side in the step,
  and for ``errors`` a failed one on the canary; read every 20 ms) to the last edge applying weight 0, in two
  parts, each against its own target: *decide*, from the evidence to the abort's write, at most one gate interval
  (two for ``slow``: its p99 gate also waits for the counted requests' first bytes, up to one TTFT later) plus
  the deciding evaluation's time from its tick (a late wake-up, its read, scrape, judgement and write,
  printed); *apply*, from the write to the last edge reading weight 0, at most 0.5 s (``APPLY_S``: the edges
  hold a blocking query on the key and wake on the write, so this is their wake-up plus this bench's readings of
  two edges, which a loaded 2-core host stretches to ~0.2 s; an edge that polled instead would miss it); for
  ``ecc`` and ``xid`` the evidence is the body's write;
- abort: from the abort's write to the later of the last edge applying weight 0 and the start of the last
  request an edge still sent to the canary; target: 2 s;
- affected: the canary's share of all requests until the end, at most the step's weight (+2 points).

Everything listens on 127.0.65.N (``--net`` names another 127.0.R)::

    .venv/bin/python bench/rollout_canary.py                 # every case
    .venv/bin/python bench/rollout_canary.py --case slow --net 127.0.75
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results  # noqa: E402
from bench.edge_procs import start_edge  # noqa: E402
from consul_io import layout  # noqa: E402
from consul_io.client import ConsulIO  # noqa: E402
from devconsul.server import DevConsulServer  # noqa: E402
from eas_agent.collectors.gpu import GpuReading  # noqa: E402
from eas_agent.score import gpu_components, gpu_problem  # noqa: E402
from operate.rollout_gates import parse_edge_metrics  # noqa: E402
from operate.rollout_plan import load_plan  # noqa: E402
from operate.rollout_run import Controller, abort_doc, begin, operate  # noqa: E402
from sim import nvml_standin  # noqa: E402
from sim.vllm.fake_gpu import fake_gpus, write_fake_gpu_file  # noqa: E402
from sim.vllm.openai_api import MODEL_NAME  # noqa: E402
from sim.vllm.registration import IUService, register_on_catalog_node  # noqa: E402
from sim.vllm.server import SimulatedIU  # noqa: E402

NET = "127.0.65"
DC = layout.DEFAULT_DATACENTER
PLAN = Path(__file__).resolve().parents[1] / "operate" / "rollouts" / "ci-short.yml"
APPLY_S = 0.5
CASES = {"good": {}, "slow": {"slowdown": 2.0}, "jitter": {"slowdown": 2.0, "one_unit": True},
         "errors": {"error_fraction": 0.02}, "ecc": {}, "xid": {}, "abort": {}}
DURING_STEP = {"abort": 0.5, "ecc": 0.2, "xid": 0.2}  # something happens during this step (the canary's weight)
CLIENTS = 24
BODY = json.dumps({"model": MODEL_NAME, "prompt": "word " * 60, "max_tokens": 16}).encode()


def body_of(node: str, ius: list[str], problem: tuple[str, str] = ("passing", ""), gpus: dict | None = None) -> str:
    """A fresh score body for ``node`` (every IU equal: the split, not the scores, is under test); ``problem``:
    the (status, reason) its agent holds the IUs in; ``gpus``: their GPU components as the agent words them."""
    status, reason = problem
    components = {"prefill_tps": 12000.0, "request_cost_s": 0.05, **(gpus or {})}
    return json.dumps({"node": node, "rack": "r1", "profile": "drain", "seq": 1, "ts": time.time(),
                       "clock_offset_s": None, "heartbeat_s": 120.0,
                       "ius": {iu: {"score": 0.05, "level": 0, "status": status, "reason": reason,
                                    "components": components} for iu in ius}})


class Cluster:
    """Two stable and two canary IUs (one per node), registered with their revisions."""

    def __init__(self, consul: str, plan, canary: dict, net: str, gpu_dir: Path):
        self.io = ConsulIO(consul)
        self.sims, self.revision_of, self.gpu_files, self.nvml = [], {}, {}, {}
        canary = dict(canary)
        first = {} if canary.pop("one_unit", False) else canary  # one_unit: the second canary IU only
        for n, (revision, options) in enumerate([(plan.stable, {}), (plan.stable, {}), (plan.canary, first),
                                                 (plan.canary, canary)]):
            node, address = f"n{n}", f"{net}.{11 + n}"
            sim = SimulatedIU(address, 0, arrival_rate=0, seed=n, **options).start()
            port = int(sim.address.rsplit(":", 1)[1])
            register_on_catalog_node(self.io, IUService(f"{node}-iu0", node, "r1", address, port, (0,), 0,
                                                        revision=revision), address)
            # the node's GPU as its agent reads it: NVML (the stand-in) over the node's own GPU file
            self.gpu_files[node] = gpu_dir / f"{node}.json"
            write_fake_gpu_file(self.gpu_files[node], fake_gpus(1, utilization=80))
            self.nvml[node] = nvml_standin.nvml_backend(self.gpu_files[node])
            self.io.kv_put(layout.score_key(DC, node), body_of(node, [f"{node}-iu0"], gpus=self.gpu_read(node)))
            self.sims.append(sim)
            self.revision_of[f"{node}-iu0"] = revision

    def gpu_read(self, node: str) -> dict:
        """``node``'s IU's GPU components from its agent's NVML backend (eas_agent/score.py ``gpu_components``)."""
        return gpu_components(tuple(self.nvml[node].read((0,))))

    def xid(self, node: str, code: int = 79) -> None:
        """``node``'s GPU logs Xid ``code``; its agent's next read publishes it."""
        gpu = {**fake_gpus(1, utilization=80)[0], "xid": [code]}
        write_fake_gpu_file(self.gpu_files[node], [gpu])
        os.utime(self.gpu_files[node], ns=(1, time.time_ns() + 10**9))
        self.io.kv_put(layout.score_key(DC, node), body_of(node, [f"{node}-iu0"], gpus=self.gpu_read(node)))

    def ecc_errors(self, node: str) -> None:
        """``node``'s GPU reports volatile uncorrectable ECC errors: its body as its agent words it
        (eas_agent/score.py ``gpu_problem``)."""
        problem = gpu_problem((GpuReading(index=0, ecc_volatile_uncorrectable=3),))
        self.io.kv_put(layout.score_key(DC, node), body_of(node, [f"{node}-iu0"], problem))

    def stop(self) -> None:
        for sim in self.sims:
            sim.stop()
        for backend in self.nvml.values():
            backend.close()


class Load:
    """``CLIENTS`` closed-loop clients spread over the edges; every answer kept as (start, end, IU, status)."""

    def __init__(self, edges: list[str]):
        self.edges, self.answers, self.stopping = edges, [], threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(CLIENTS)]
        for thread in self.threads:
            thread.start()

    def _client(self, n: int) -> None:
        url = f"http://{self.edges[n % len(self.edges)]}/v1/completions"
        while not self.stopping.is_set():
            started = time.time()
            request = urllib.request.Request(url, data=BODY, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    answer.read()
                    status, iu = answer.status, answer.headers.get("X-Eas-IU")
            except urllib.error.HTTPError as exc:
                status, iu = exc.code, exc.headers.get("X-Eas-IU")
            except OSError:
                status, iu = 0, None
            self.answers.append((started, time.time(), iu, status))

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(35)


def edge_reading(admin: str) -> tuple[float, dict, dict, dict]:
    """(the weight the edge applies, requests and errors by revision, first bytes by (revision, IU)) from its
    /metrics (NaN, {}, {}, {} when it did not answer)."""
    try:
        with urllib.request.urlopen(f"http://{admin}/metrics", timeout=2) as answer:
            text = answer.read().decode()
    except OSError:
        return float("nan"), {}, {}, {}
    requests, errors, _, units = parse_edge_metrics(text)
    weight = next((float(line.split()[1]) for line in text.splitlines()
                   if line.startswith("eas_edge_rollout_weight ")), float("nan"))
    return weight, requests, errors, {(r, iu): n for r, ius in units.items() for iu, (_, n) in ius.items()}


def watch_edges(admins: list[str], stop: threading.Event, seen: list) -> None:
    """Every edge's reading every 20 ms: (time, [weights], {revision: requests}, {revision: errors},
    {(revision, IU): first bytes}), summed."""
    while not stop.is_set():
        readings = [edge_reading(a) for a in admins]
        requests, errors, units = defaultdict(float), defaultdict(float), defaultdict(float)
        for _, r, e, u in readings:
            for revision, n in r.items():
                requests[revision] += n
            for revision, n in e.items():
                errors[revision] += n
            for unit, n in u.items():
                units[unit] += n
        seen.append((time.time(), [w for w, *_ in readings], dict(requests), dict(errors), dict(units)))
        stop.wait(0.02)


def run_case(case: str, plan_path: Path = PLAN, net: str = NET) -> dict:
    plan = load_plan(plan_path)
    with DevConsulServer(addr=f"{net}.1:0") as server, tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "edge.yml"
        config.write_text("debug_headers: true\n")
        cluster = Cluster(server.address, plan, CASES[case], net, Path(tmp))
        edges = [start_edge(server.address, ["--config", str(config), "--listen", f"{net}.{2 + k}:0",
                                             "--admin-listen", f"{net}.{2 + k}:0", "--no-push"]) for k in range(2)]
        admins = [process.admin_address for process, _ in edges]
        plan = replace(plan, edges=tuple(admins))
        load = Load([address for _, address in edges])
        stop, weights, events = threading.Event(), [], []
        watcher = threading.Thread(target=watch_edges, args=(admins, stop, weights), daemon=True)
        watcher.start()
        try:
            time.sleep(1.0)  # stable only, before the rollout
            index, doc, _ = begin(cluster.io, plan, DC, time.time())
            events.append((time.time(), doc.state, doc.effective_weight))
            controller = Controller(cluster.io, plan, DC,
                                    on_event=lambda d, text: events.append((time.time(), d.state, d.effective_weight)))
            aborted_at = None
            if case in DURING_STEP:  # during a step: an abort at 50%, ECC errors or an XID at 20%
                runner = threading.Thread(target=lambda: controller.run(doc, index), daemon=True)
                runner.start()
                while not any(w == DURING_STEP[case] for _, _, w in events):
                    time.sleep(0.05)
                time.sleep(2.0 if case == "abort" else 1.0)
                aborted_at = time.time()
                if case == "abort":
                    operate(cluster.io, DC, lambda d: abort_doc(d, time.time(), "bench: operator abort"))
                elif case == "ecc":
                    cluster.ecc_errors("n2")  # a canary node
                else:
                    cluster.xid("n2")
                runner.join(plan.interval_s * 3 + 5)
                time.sleep(1.0)
                final = operate(cluster.io, DC, lambda d: d)
            else:
                final = controller.run(doc, index)
                time.sleep(0.5)
        finally:
            load.stop()
            stop.set()
            watcher.join(5)
            for process, _ in edges:
                process.terminate()
                process.wait(10)
            cluster.stop()
    took = max(controller.took_s[-1:], default=0.0)  # the evaluation that decided (the last)
    row = measure(case, plan, final, load.answers, weights, events, cluster.revision_of, aborted_at, took)
    jitter = [r.value for _, _, results in controller.evaluations for r in results
              if r.metric == "ttft_jitter_delta" and r.value is not None]
    row["jitter_delta_max"] = round(max(jitter), 4) if jitter else None  # the gate's largest conclusive value
    return row


def measure(case, plan, final, answers, weights, events, revision_of, aborted_at, took_s) -> dict:
    started = events[0][0]
    during = sorted(a for a in answers if a[0] >= started)
    canary = [a for a in during if revision_of.get(a[2]) == plan.canary]
    row = {"case": case, "state": final.state, "reason": final.reason, "requests": len(during),
           "canary_requests": len(canary), "canary_share": round(len(canary) / max(1, len(during)), 4)}
    zero_at = next((t for t, ws, *_ in weights if t >= (aborted_at or started) and ws and all(w == 0 for w in ws)),
                   None)
    if case == "abort":
        last_canary_start = max((a[0] for a in canary if a[0] >= aborted_at), default=aborted_at)
        row["abort_to_stable_s"] = round(max(zero_at or float("inf"), last_canary_start) - aborted_at, 3)
        row["target"] = "abort_to_stable_s <= 2"
        row["met"] = final.state == "aborted" and row["abort_to_stable_s"] <= 2.0
        return row
    if case == "good":
        row["target"] = "promoted through every step"
        row["met"] = final.state == "promoted" and final.step == len(plan.steps) - 1
        return row
    evidence = aborted_at if case in ("ecc", "xid") else evidence_at(plan, weights, events, errors=case == "errors",
                                                                      per_unit=case == "jitter")
    decided_at = next((t for t, state, _ in events if state == "aborted"), None)
    row["rollback_s"] = round(zero_at - evidence, 3) if zero_at and evidence else None
    row["decide_s"] = round(decided_at - evidence, 3) if decided_at and evidence else None
    row["apply_s"] = round(zero_at - decided_at, 3) if zero_at and decided_at else None
    row["evaluation_s"] = round(took_s, 3)
    weight = max(w for _, _, w in events if w < 1.0)
    # the decision reads what the edges counted when its evaluation began, and is written when it ends. The
    # evidence counts requests when they are sent; the p99 of TTFT (``slow``) also needs their first bytes,
    # which land up to one TTFT later (the slow canary's p99 is ~0.7 s, under one interval): one more interval.
    intervals = 2 if case == "slow" else 1
    bound = intervals * plan.interval_s + took_s
    row["target"] = (f"decide_s <= {bound:.2f} ({'two gate intervals' if intervals == 2 else 'one gate interval'}"
                     f" + the evaluation's {took_s:.2f} s); "
                     f"apply_s <= {APPLY_S}; canary share <= {weight + 0.02:g}")
    row["met"] = (final.state == "aborted" and row["decide_s"] is not None and row["decide_s"] <= bound
                  and row["apply_s"] is not None and row["apply_s"] <= APPLY_S
                  and row["canary_share"] <= weight + 0.02)
    return row


def evidence_at(plan, readings, events, errors: bool, per_unit: bool = False) -> float | None:
    """When the edges had counted, in the step that failed, ``min_requests`` answers on each side (and with
    ``errors`` a failed one on the canary; with ``per_unit`` two IUs a side each with a quarter of
    ``min_requests`` first bytes): from the 20 ms readings, as the controller's gates count them."""
    step_start = max(t for t, _, w in events if w == max(w for _, _, w in events if w < 1.0))
    # The base is the last reading taken before the step began, as the controller scrapes its base when it writes
    # the step. A watcher that a loaded host wakes late would otherwise take its base after the step's first
    # answers, count fewer than the gates did, and never see evidence the controller acted on.
    base = next((r for r in reversed(readings) if r[0] < step_start), None)
    for t, _, requests, failed, units in readings if base is not None else ():
        if t < base[0]:
            continue
        sides = [requests.get(r, 0) - base[2].get(r, 0) for r in (plan.stable, plan.canary)]
        if min(sides) < plan.min_requests or (errors and failed.get(plan.canary, 0) <= base[3].get(plan.canary, 0)):
            continue
        counted = [sum(1 for (r, iu), n in units.items() if r == side and n - base[4].get((r, iu), 0)
                       >= max(1.0, plan.min_requests / 4)) for side in (plan.stable, plan.canary)]
        if not per_unit or min(counted) >= 2:
            return t
    return None


def table(rows: list[dict]) -> str:
    lines = ["| case | end state | requests | canary share | rollback / abort s | decide + apply s | target "
             "| verdict |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        seconds = r.get("rollback_s", r.get("abort_to_stable_s", "-"))
        parts = f"{r['decide_s']} + {r['apply_s']}" if "decide_s" in r else "-"
        lines.append(f"| {r['case']} | {r['state']} | {r['requests']} | {r['canary_share']:.3f} | {seconds} "
                     f"| {parts} | {r['target']} | {'met' if r['met'] else 'NOT met'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=list(CASES), action="append", help="the cases to run (default: all)")
    parser.add_argument("--net", default=NET, help=f"the loopback 127.0.R every listener takes (default {NET})")
    results.add_argument(parser, __file__)
    args = parser.parse_args(argv)
    load = results.load_at_start()
    rows = [run_case(case, net=args.net) for case in args.case or CASES]
    print(table(rows))
    for row in rows:
        print(f"{row['case']}: {row['reason'][:200] or row['state']}; largest ttft_jitter_delta "
              f"{row['jitter_delta_max']}")
    met = all(r["met"] for r in rows)
    numbers = {f"{r['case']}_{key}": r[key] for r in rows
               for key in ("state", "requests", "canary_share", "rollback_s", "decide_s", "apply_s", "evaluation_s",
                           "abort_to_stable_s",
                           "jitter_delta_max")
               if key in r}
    summary = "; ".join(f"{r['case']}: {r['state']}" + (f" in {r['rollback_s']} s" if r.get("rollback_s") else "")
                        + (f" {r['abort_to_stable_s']} s" if "abort_to_stable_s" in r else "") for r in rows)
    return results.record_met(args.results, met, script=__file__, argv=argv, numbers=numbers, host=load,
                              target="good promoted; slow, one slow unit (jitter), 2% errors, ECC and XID rolled back "
                                     "within one gate interval (+ the deciding evaluation's time; the edges apply it "
                                     "within 0.5 s) at most their step's "
                                     "share; abort on stable within 2 s", summary=summary)


if __name__ == "__main__":
    results.exit_with(main, __file__)
