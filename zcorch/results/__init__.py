"""The on-disk result set (manifest, plan, meta, runs.jsonl, baselines.jsonl, logs) and the derived rates.
No pandas here: the analysis package reads what this package writes."""
