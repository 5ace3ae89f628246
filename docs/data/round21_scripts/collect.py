"""docs/data/e2e_round21.json from runs B1, G1-G5 (their bench.json files copied to
/tmp/dd/<run>/<run>_l<level>.json from the device's $OUT; calls 2 and 3 sent them as res.tgz)."""
import glob
import json
import os
from pathlib import Path

BASE = "cb86663 (main)"
NEW = "cb86663 + graphs captured on the partition's stream (this round's change)"
F = "--max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
out = {
    "note": "Random weights (--load-format dummy, --dummy-logits peaked): speed and memory "
    "only, not speech quality.",
    "date": "2026-12-02",
    "machine": "one NVIDIA H200 (server and load generator on the same machine)",
    "code": {
        "B1": BASE + " sync --decoder-sms 72 (round 20's E4 arrangement)",
        "G1": BASE + " sync --engine-sms 56 (decoder 76); engine graphs on any SM",
        "G2": BASE + " sync --engine-sms 56 (decoder 76); engine graphs on any SM",
        "G3": BASE + " sync --engine-sms 48 (decoder 84); engine graphs on any SM",
        "G4": NEW + " sync --engine-sms 56 (decoder 76); engine graphs confined to its 56",
        "G5": NEW + " sync --engine-sms 56 (decoder 76); engine graphs confined to its 56",
    },
    "server_flags": F,
    "bench": "--ramp 8 --lengths short --max-new-tokens 216 --ignore-eos --warmup 2 "
    "--duration 30 --timeout 40 --processes 2",
    "request_columns": ["start_s", "ttfa_s", "stall_s"],
    "runs": {},
}
for run in out["code"]:
    levels, requests = [], {}
    for path in sorted(glob.glob(f"/tmp/dd/{run}/{run}_l*.json")):
        name = os.path.basename(path)[len(run) + 2 : -5]
        bench = json.loads(Path(path).read_text())
        levels.append(dict(bench["levels"][0], label=name))
        requests[name] = [
            [round(r["start_s"], 3), r["ttfa_s"] and round(r["ttfa_s"], 4),
             r["stall_s"] and round(r["stall_s"], 5)]
            for r in bench["requests"]
        ]
    out["runs"][run] = {"levels": levels, "requests": requests}
    health = f"/tmp/dd/{run}/health_end.json"  # /health after the run's last level
    if os.path.exists(health):
        out["runs"][run]["health_end"] = json.loads(Path(health).read_text())
# G1 at 512 and 576 streams: their bench.json did not come back (the device's file-count
# limit); the summary lines summ.py printed on the device (ttfa = p50/p90/p99).
out["runs"]["G1"]["summary_only"] = {
    "512": "n=2048 ok=2048 err=0 inflight=422 ttfa=0.264/0.315/0.399 rtf90=0.80 max=0.82 "
    "stalled=140 fps=13569 steps=40.7/326 busy=0.80/0.59 f/call=125 f/job=19.6",
    "576": "n=2069 ok=2069 err=0 inflight=481 ttfa=0.308/0.521/0.625 rtf90=1.02 max=1.05 "
    "stalled=1129 fps=13190 steps=35.6/361 busy=0.80/0.64 f/call=120 f/job=12.2",
}
Path("docs/data/e2e_round21.json").write_text(json.dumps(out, separators=(",", ":")))
