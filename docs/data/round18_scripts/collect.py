"""docs/data/e2e_round18.json from the runs' bench.json files (unpacked under /tmp/r19/<run>
from the device's A1.tgz, S1A2.tgz, P.tgz, A3.tgz and A4.tgz)."""
import glob
import json
import os

MAIN = "4df368d (main)"
OFF = "4bb7e8b (branch wip/pacing; pacing present but off: one check per step)"
CODE = {
    "S1": MAIN,
    "A1": MAIN + " with --async-scheduling",
    "A2": MAIN + " with --async-scheduling",
    "A3": OFF + " with --async-scheduling",
    "A4": OFF + " with --async-scheduling",
    "P1": "4bb7e8b (branch wip/pacing, not merged) with --pace-lead 2",
    "P2": "4bb7e8b (branch wip/pacing, not merged) with --pace-lead 2 --async-scheduling",
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
    for path in sorted(glob.glob(f"/tmp/r19/{run}/{run}_l*.json")):
        name = os.path.basename(path)[len(run) + 2 : -5]  # "448" or "448b" (a repeat)
        bench = json.load(open(path))
        levels.append(dict(bench["levels"][0], label=name))
        requests[name] = [
            [round(r["start_s"], 3), r["ttfa_s"] and round(r["ttfa_s"], 4)]
            for r in bench["requests"]
        ]
    entry = {"levels": levels, "requests": requests}
    health = f"/tmp/r19/{run}/health_start.json"
    if os.path.exists(health):
        entry["server_gpu_memory_at_start"] = json.load(open(health))["gpu_memory"]
    out["runs"][run] = entry
json.dump(out, open("docs/data/e2e_round18.json", "w"), separators=(",", ":"))
