"""docs/data/e2e_round22.json from runs H1-H3, G6-G8 (each call's res.tgz unpacked under
/work/r22/<call>/<run>/<run>_l<level>.json; calls c1-c5 ran run24a.sh-run24e.sh)."""
import glob
import json
import os
from pathlib import Path

CODE = "9f32034 (main), sync, --engine-sms {sms} (decoder on the others), deadline {d} s"
out = {
    "note": "Random weights (--load-format dummy, --dummy-logits peaked): speed and memory "
    "only, not speech quality.",
    "date": "2026-12-02",
    "machine": "one NVIDIA H200 (server and load generator on the same machine); machine A "
    "ran call c1 (H1, H2), machine B calls c2-c5 (H1b, H3, G6, H1c, G7, G8)",
    "code": {
        "H1": CODE.format(sms=56, d=0.15), "H2": CODE.format(sms=64, d=0.17),
        "H1b": CODE.format(sms=56, d=0.15), "H3": CODE.format(sms=56, d=0.13),
        "G6": CODE.format(sms=56, d=0.17), "H1c": CODE.format(sms=56, d=0.15),
        "G7": CODE.format(sms=56, d=0.17), "G8": CODE.format(sms=56, d=0.17),
    },
    "server_flags": "--max-decode-batch 16 --early-chunk-margin 0.12 (plus the run's "
    "--engine-sms and --first-chunk-deadline)",
    "bench": "--ramp 8 --lengths short --max-new-tokens 216 --ignore-eos --warmup 2 "
    "--duration 30 --timeout 40 --processes 2",
    "request_columns": ["start_s", "ttfa_s", "stall_s"],
    "runs": {},
}
for run in out["code"]:
    folder = glob.glob(f"/work/r22/c*/{run}")[0]
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
Path("docs/data/e2e_round22.json").write_text(json.dumps(out, separators=(",", ":")))
