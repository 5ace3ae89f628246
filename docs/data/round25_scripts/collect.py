"""docs/data/e2e_round25.json from round 25's three device calls (each call's files unpacked
under /work/r25/c1..c3: c1 ran run27a.sh (GPU tests, step profile, D15n), c2 run27b.sh (N1,
O1, N2: HEAD against 0bf2852 on one lease), c3 run27c.sh (no server: host_phases-style CPU
timings and the engine alone under churn, its log only))."""
import glob
import json
import os
from pathlib import Path

RUNS = {  # run: (call, tree)
    "D15n": ("c1", "74f9c73 (main, persistent batch)"),
    "N1": ("c2", "74f9c73 (main, persistent batch)"),
    "O1": ("c2", "0bf2852 (round 24's tree)"),
    "N2": ("c2", "74f9c73 (main, persistent batch)"),
}
out = {
    "note": "Random weights (--load-format dummy, --dummy-logits peaked): speed and memory "
    "only, not speech quality.",
    "date": "2026-12-03",
    "machine": "one NVIDIA H200 per call (server and load generator on the same machine); "
    "each call a different lease",
    "server_flags": "--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 "
    "--boost-frames 64 --async-scheduling --first-chunk-deadline 0.15",
    "bench": "--ramp 8 --lengths short --max-new-tokens 216 --ignore-eos --warmup 2 "
    "--duration 30 --timeout 40 --processes 2",
    "request_columns": ["start_s", "ttfa_s", "stall_s"],
    "runs": {},
    "call3_log": Path("/work/r25/c3/log.txt").read_text().splitlines(),
    "call1_engine": json.loads(Path("/work/r25/c1/engine.json").read_text()),
}
for run, (call, tree) in RUNS.items():
    folder = f"/work/r25/{call}/{run}"
    levels, requests = [], {}
    for path in sorted(glob.glob(f"{folder}/{run}_l*.json")):
        name = os.path.basename(path)[len(run) + 2 : -5]
        bench = json.loads(Path(path).read_text())
        levels.append(dict(bench["levels"][0], label=name))
        requests[name] = [
            [round(r["start_s"], 3), r["ttfa_s"] and round(r["ttfa_s"], 4),
             r["stall_s"] and round(r["stall_s"], 5)]
            for r in bench["requests"]
        ]
    out["runs"][run] = {"call": call, "code": tree, "levels": levels, "requests": requests}
    health = f"{folder}/health_end.json"
    if os.path.exists(health):
        out["runs"][run]["health_end"] = json.loads(Path(health).read_text())
Path("docs/data/e2e_round25.json").write_text(json.dumps(out, separators=(",", ":")))
