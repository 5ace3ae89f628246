"""docs/data/e2e_round26.json from round 26's device calls (files unpacked under /work/r26:
c1 = run28a.sh's $OUT, c2 = run28b.sh's, N3 and O3 = the two server calls' run folders)."""
import glob
import json
import os
from pathlib import Path

R = Path("/work/r26")
out = {
    "note": "Random weights (--load-format dummy, --dummy-logits peaked): speed and memory "
    "only, not speech quality.",
    "date": "2026-12-03",
    "call1": {  # main at 5b1d78d: engine alone on 56 SMs, the fused upper bound, a profile
        "engine_load": json.loads((R / "c1/load.json").read_text()),
        "fused_bound": json.loads((R / "c1/fused.json").read_text()),
        "profile_gaps": (R / "c1/gaps.txt").read_text().splitlines(),
        "log": (R / "c1/log.txt").read_text().splitlines(),
    },
    "call2": {  # one lease: a0d5e4f, 5b1d78d, a0d5e4f
        run: json.loads((R / f"c2/{run}.json").read_text()) for run in ("new1", "old1", "new2")
    },
    "server_flags": "--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 "
    "--boost-frames 64 --async-scheduling --first-chunk-deadline 0.15",
    "bench": "--ramp 8 --lengths short --max-new-tokens 216 --ignore-eos --warmup 2 "
    "--duration 30 --timeout 40 --processes 2",
    "request_columns": ["start_s", "ttfa_s", "stall_s"],
    "runs": {},
}
out["call2"]["log"] = (R / "c2/log.txt").read_text().splitlines()
for run, tree in (("N3", "a0d5e4f"), ("O3", "5b1d78d")):
    levels, requests = [], {}
    for path in sorted(glob.glob(f"{R}/{run}/{run}_l*.json")):
        name = os.path.basename(path)[len(run) + 2 : -5]
        bench = json.loads(Path(path).read_text())
        levels.append(dict(bench["levels"][0], label=name))
        requests[name] = [
            [round(r["start_s"], 3), r["ttfa_s"] and round(r["ttfa_s"], 4),
             r["stall_s"] and round(r["stall_s"], 5)]
            for r in bench["requests"]
        ]
    out["runs"][run] = {"code": tree, "levels": levels, "requests": requests}
    for end in ("health_start", "health_end"):
        out["runs"][run][end] = json.loads((R / run / f"{end}.json").read_text())
Path("docs/data/e2e_round26.json").write_text(json.dumps(out, separators=(",", ":")))
