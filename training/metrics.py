"""From the ranks' step records to the run's figures, under the names in DESIGN.md (pure).

busy_fraction is compute time over the rank's training time; the rest is communication,
waiting for the slowest rank (idle) and waiting for data.
"""

from __future__ import annotations

WARMUP_STEPS = 1  # the first step includes DDP's bucket rebuild; throughput skips it


def summarize(result: dict, global_batch: int, target_accuracy: float | None) -> dict:
    ranks = sorted(result["ranks"], key=lambda r: r["rank"])
    world = len(ranks)
    steps = len(ranks[0]["records"])
    lead = ranks[0]["records"]
    step_times = [r["step_s"] for r in lead]
    wall = sum(step_times)
    timed = step_times[WARMUP_STEPS:] or step_times
    throughput = global_batch * len(timed) / sum(timed)
    bytes_total = sum(sum(rec["bytes_sent"] for rec in r["records"]) for r in ranks)
    m: dict[str, float] = {
        "throughput_samples_per_s": throughput,
        "wall_time_s": wall,
        "comm_bytes_total": bytes_total,
        "comm_bytes_per_step": bytes_total / steps,
        "steps": steps,
        "replans": len(ranks[0]["replans"]),
        "restarts": ranks[0].get("recovery", {}).get("restarts", 0),
        "steps_redone": ranks[0].get("recovery", {}).get("steps_redone", 0),
    }
    idle = data = busy = talk = 0.0
    for r in ranks:
        recs = r["records"]
        total = sum(x["step_s"] for x in recs)
        compute = sum(x["compute_s"] for x in recs)
        comm = sum(x["comm_s"] for x in recs)
        wait = sum(x["data_s"] for x in recs)
        rank_idle = sum(x["idle_s"] for x in recs)
        samples = sum(x["batch"] for x in recs)
        idle += rank_idle
        data += wait
        busy += compute
        talk += comm
        k = r["rank"]
        m[f"rank{k}/busy_fraction"] = compute / total
        m[f"rank{k}/compute_s"] = compute
        m[f"rank{k}/comm_s"] = comm
        m[f"rank{k}/data_wait_s"] = wait
        m[f"rank{k}/idle_s"] = rank_idle
        m[f"rank{k}/local_batch"] = recs[-1]["batch"]
        m[f"rank{k}/samples_per_s"] = samples / compute if compute else 0.0
        m[f"rank{k}/comm_bytes"] = sum(x["bytes_sent"] for x in recs)
    # where the ranks' time went, summed over ranks: compute + comm + idle + data wait ~ 1
    m["compute_fraction"] = busy / (world * wall)
    m["comm_fraction"] = talk / (world * wall)
    m["straggler_idle_fraction"] = idle / (world * wall)
    # share of the training loop spent recording figures (rank 0 writes progress each step)
    m["tracking_overhead_fraction"] = max(r.get("bookkeeping_s", 0.0) for r in ranks) / wall
    m["data_wait_fraction"] = data / (world * wall)
    evals = ranks[0]["evals"]
    if evals:
        m["final_accuracy"] = evals[-1]["accuracy"]
    if target_accuracy is not None:
        hit = next((e for e in evals if e["accuracy"] >= target_accuracy), None)
        if hit is not None:
            m["time_to_target_s"] = hit["train_time_s"]
    hits = sum(r["cache"]["hits"] for r in ranks)
    misses = sum(r["cache"]["misses"] for r in ranks)
    m["s3_bytes_read"] = sum(r["cache"]["bytes_read"] for r in ranks)
    m["cache_hit_ratio"] = hits / (hits + misses) if hits + misses else 0.0
    return m


def step_series(result: dict, global_batch: int) -> list[dict]:
    """Per step: global mean loss, step time (rank 0), and per-rank busy fraction and batch."""
    ranks = sorted(result["ranks"], key=lambda r: r["rank"])
    series = []
    for i, lead in enumerate(ranks[0]["records"]):
        row = {
            "step": lead["step"],
            "loss": sum(r["records"][i]["loss_sum"] for r in ranks) / global_batch,
            "step_time_s": lead["step_s"],
        }
        for r in ranks:
            rec = r["records"][i]
            row[f"rank{r['rank']}/busy_fraction"] = rec["compute_s"] / rec["step_s"]
            row[f"rank{r['rank']}/local_batch"] = rec["batch"]
        series.append(row)
    return series
