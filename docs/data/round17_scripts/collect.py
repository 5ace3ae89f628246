"""docs/data/e2e_round17.json from the runs' bench.json files (unpacked under /tmp/R1, /tmp/C1,
/tmp/R2, /tmp/R3 from the device's R*.tgz / C1.tgz)."""
import glob
import json
import os

CODE = {
    "R1": "d9b76db (main)",
    "C1": "d9b76db (main) with --first-chunk-frames 8",
    "R2": "f49e5b4 (branch wip/speculative-codes, not merged)",
    "R3": "d9b76db (main)",
}
out = {
    "note": "Random weights (--load-format dummy, --dummy-logits peaked): speed and memory "
    "only, not speech quality.",
    "date": "2026-12-02",
    "machine": "one NVIDIA H200 (server and load generator on the same machine)",
    "code": CODE,
    "server_flags": "--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 "
    "--early-chunk-margin 0.12",
    "bench": "--ramp 8 --lengths short --max-new-tokens 216 --ignore-eos --warmup 2 "
    "--duration 30 --timeout 40 --processes 2",
    "request_columns": ["start_s", "ttfa_s"],
    "runs": {},
}
for run in CODE:
    levels, requests = [], {}
    for path in sorted(glob.glob(f"/tmp/{run}/{run}_l*.json")):
        name = os.path.basename(path)[len(run) + 2 : -5]  # "448" or "448b" (a repeat)
        bench = json.load(open(path))
        level = dict(bench["levels"][0], label=name)
        levels.append(level)
        requests[name] = [
            [round(r["start_s"], 3), r["ttfa_s"] and round(r["ttfa_s"], 4)]
            for r in bench["requests"]
        ]
    entry = {"levels": levels, "requests": requests}
    health = f"/tmp/{run}/health_start.json"
    if os.path.exists(health):
        entry["server_gpu_memory_at_start"] = json.load(open(health))["gpu_memory"]
    out["runs"][run] = entry
json.dump(out, open("docs/data/e2e_round17.json", "w"), separators=(",", ":"))
