"""docs/data/e2e_round23.json from runs B32-B64b, N0, N1 (each call's res.tgz unpacked under
/work/r23/<call>/<run>/<run>_l<level>.json; calls c1-c7 ran run25a.sh-run25g.sh)."""
import glob
import json
import os
from pathlib import Path

CODE = "6558b64 (main), sync, --engine-sms 56, deadline 0.17 s, {boost}"
RUNS = {
    "B32": 32, "B12": 12, "B20": 20, "B32b": 32, "B48": 48, "B64": 64, "B48b": 48,
    "N0": 0, "B64b": 64, "N1": 0, "B64c": 64,
}
out = {
    "note": "Random weights (--load-format dummy, --dummy-logits peaked): speed and memory "
    "only, not speech quality.",
    "date": "2026-12-03",
    "machine": "one NVIDIA H200 (server and load generator on the same machine): one lease "
    "for calls c1-c6, a second (cold) lease for c7 (B64c)",
    "code": {
        run: CODE.format(boost=f"--boost-frames {b}" if b else "no boost steps")
        for run, b in RUNS.items()
    },
    "server_flags": "--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 "
    "--first-chunk-deadline 0.17 (plus the run's --boost-frames)",
    "bench": "--ramp 8 --lengths short --max-new-tokens 216 --ignore-eos --warmup 2 "
    "--duration 30 --timeout 40 --processes 2",
    "request_columns": ["start_s", "ttfa_s", "stall_s"],
    "runs": {},
}
for run in RUNS:
    folder = glob.glob(f"/work/r23/c*/{run}")[0]
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
    out["runs"][run] = {"call": folder.split("/")[-2], "levels": levels, "requests": requests}
    health = f"{folder}/health_end.json"  # /health after the run's last level
    if os.path.exists(health):
        out["runs"][run]["health_end"] = json.loads(Path(health).read_text())
Path("docs/data/e2e_round23.json").write_text(json.dumps(out, separators=(",", ":")))
