"""Score rows as ``cli.views.scores.rows`` returns them: 8 IUs, one busy with a long prompt (a score that is
almost all prefill_s: the reader's ``busy``, no anomaly), one stuck (``frozen``), one warming up (``ramp``), one
with markup in the agent's reason, one scored by the seed profile (weighted terms: 0.3 x 20 GB + 0.5 x 2.5 s
= 7.25, no prefix hit rate); one with prefix caching off, one warming up with no hits yet, the others at 32%."""

from __future__ import annotations


def row(iu, score, health="passing", reason="", anomaly=None, weight=1.0, **components):
    node = iu.rsplit("-", 1)[0]
    return {"iu": iu, "rack": node[:3], "node": node, "score": score, "status": "passing", "reason": reason,
            "health": health, "age_s": 0.4, "stale": False, "anomaly": anomaly, "weight": weight,
            "components": components}


def drain(queue=0.0, kv=0.0, step=0.0011, prefill=0.0, waiting=0, running=2, usage=0.0303, hit=0.315):
    return {"queue_s": queue, "kv_s": kv, "step_s": step, "prefill_s": prefill, "waiting": waiting,
            "running": running, "kv_usage": usage, "admitted_prefill_tokens": round(prefill * 9000),
            "prefill_tps": 9000.0, "decode_tps": 1800.0, "tokens_total": 123456, "prefix_hit_rate": hit}


def rows() -> list[dict]:
    out = [row(f"r0{r}n0{n}-iu{i}", 0.0011 + 0.0002 * i, **drain(step=0.0011 + 0.0002 * i))
           for r in (1, 2) for n in (1, 2) for i in (0, 1)]
    out[2] = row("r01n02-iu0", 1.9511, anomaly="busy", weight=0.0, **drain(prefill=1.95))
    out[3] = row("r01n02-iu1", 0.0013, anomaly="ramp", **drain(step=0.0013, hit=0.0))
    out[1] = row("r01n01-iu1", 0.0013, **drain(step=0.0013, hit=-1.0))  # prefix caching off (vLLM V0)
    out[4] = row("r02n01-iu0", 0.0011, anomaly="frozen", weight=0.3, **drain(running=2))
    out[6] = row("r02n02-iu0", 7.25, kv_cache_gb=20.0, kv_cache_age_s=2.5, net_mb_per_s=0.0, kv_usage=0.4,
                 running=3, waiting=0, tokens_total=98765)
    out[5] = row("r02n01-iu1", None, health="warning", reason="vLLM scrape: bad line [/] 'x{' at 3", **{})
    out[7] = row("r02n02-iu1", None, health="maintenance", reason="clusterctl: new IU, waiting for preflight")
    return out


SUMMARY = {"window_s": 10.0, "completed_window": 41, "ttft_p50_s": 0.081, "ttft_p95_s": 0.212, "e2e_p50_s": 1.9,
           "e2e_p95_s": 3.4, "completed_total": 240, "inflight": 5, "errors": 0, "unroutable": 0,
           "pick_modes": {"p2c": 230, "fallback": 10}}
