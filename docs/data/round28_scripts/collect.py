"""docs/data/e2e_round28.json from round 28's device calls (their $OUT folders unpacked under
/work/r28/c1 ... c4; each call's res.tgz unpacked in its folder)."""
import glob
import json
import os
from pathlib import Path

R = Path("/work/r28")
CODE = {"H1": "864f08c (relay, Connection pipes)"}
PIPELINE = {"H": "http (relay)", "C": "core"}
out = {
    "note": "Random weights (--load-format dummy, --dummy-logits peaked): speed and memory "
    "only, not speech quality.",
    "date": "2026-12-03",
    "server_flags": "--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 "
    "--boost-frames 64 --async-scheduling --first-chunk-deadline 0.15 --stream-pipeline X",
    "bench": "--ramp 8 --lengths short --max-new-tokens 216 --ignore-eos --warmup 2 "
    "--duration 30 --timeout 40 --processes 2",
    "request_columns": ["start_s", "ttfa_s", "stall_s"],
    "calls": {},
    "runs": {},
}
for call in sorted(os.listdir(R)):
    out["calls"][call] = {"log": (R / call / "log.txt").read_text().splitlines()}
out["calls"]["c5"] = {"log": ["81 passed, 311 deselected, 14 warnings in 72.90s (0:01:12)"],
                      "command": "the pytest line of run30d.sh (call 4's own run printed no "
                      "summary: -q with a grep)"}
for folder in sorted(glob.glob(f"{R}/c*/*/")):
    run = os.path.basename(folder.rstrip("/"))
    levels, requests = [], {}
    paths = glob.glob(f"{folder}/{run}_l*.json")
    for path in sorted(paths, key=lambda p: int(os.path.basename(p)[len(run) + 2 : -5])):
        name = os.path.basename(path)[len(run) + 2 : -5]
        bench = json.loads(Path(path).read_text())
        level = dict(bench["levels"][0], label=name)
        level["bench_host_probe_ms"] = bench["meta"].get("host_probe_ms")
        levels.append(level)
        requests[name] = [
            [round(r["start_s"], 3), r["ttfa_s"] and round(r["ttfa_s"], 4),
             r["stall_s"] and round(r["stall_s"], 5)]
            for r in bench["requests"]
        ]
    entry = {"call": Path(folder).parent.name, "code": CODE.get(run, "d129b1b"),
             "stream_pipeline": PIPELINE[run[0]], "levels": levels, "requests": requests}
    for end in ("health_start", "health_end"):
        if (Path(folder) / f"{end}.json").exists():
            entry[end] = json.loads((Path(folder) / f"{end}.json").read_text())
    out["runs"][run] = entry
Path("docs/data/e2e_round28.json").write_text(json.dumps(out, separators=(",", ":")))
print({k: [lv["label"] for lv in v["levels"]] for k, v in out["runs"].items()})
