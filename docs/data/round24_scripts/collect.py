"""docs/data/e2e_round24.json from runs A64 ... D15b (each call's res.tgz unpacked under
/work/r24/<call>/<run>/<run>_l<level>.json; calls c1-c5 ran run26a.sh-run26e.sh; run26f.sh,
the sixth call, brought nothing back)."""
import glob
import json
import os
from pathlib import Path

SYNC, ASYNC = "sync", "--async-scheduling"
RUNS = {  # run: (scheduling, --first-chunk-deadline, --engine-sms)
    "A64": (ASYNC, 0.17, 56), "B64": (SYNC, 0.17, 56), "A64b": (ASYNC, 0.17, 56),
    "E64": (ASYNC, 0.17, 64), "A64c": (ASYNC, 0.17, 56), "D15": (ASYNC, 0.15, 56),
    "D15b": (ASYNC, 0.15, 56),
}
CODE = {run: "0bf2852 (main)" for run in RUNS}
out = {
    "note": "Random weights (--load-format dummy, --dummy-logits peaked): speed and memory "
    "only, not speech quality.",
    "date": "2026-12-03",
    "machine": "one NVIDIA H200 (server and load generator on the same machine), one lease "
    "for calls c1-c5",
    "server_flags": "--max-decode-batch 16 --early-chunk-margin 0.12 --boost-frames 64 "
    "(plus the run's scheduling, --first-chunk-deadline and --engine-sms)",
    "bench": "--ramp 8 --lengths short --max-new-tokens 216 --ignore-eos --warmup 2 "
    "--duration 30 --timeout 40 --processes 2",
    "request_columns": ["start_s", "ttfa_s", "stall_s"],
    "runs": {},
}
for run, (scheduling, deadline, sms) in RUNS.items():
    found = glob.glob(f"/work/r24/c*/{run}")
    if not found:
        continue
    folder = found[0]
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
    out["runs"][run] = {
        "call": folder.split("/")[-2],
        "code": CODE[run],
        "scheduling": scheduling,
        "first_chunk_deadline": deadline,
        "engine_sms": sms,
        "levels": levels,
        "requests": requests,
    }
    health = f"{folder}/health_end.json"  # /health after the run's last level
    if os.path.exists(health):
        out["runs"][run]["health_end"] = json.loads(Path(health).read_text())
Path("docs/data/e2e_round24.json").write_text(json.dumps(out, separators=(",", ":")))
