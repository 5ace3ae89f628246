"""docs/data/e2e_round27.json from round 27's device calls (their $OUT folders unpacked under
/work/r27/c1 ... c5: run29a.sh ... run29e.sh; each call's res.tgz unpacked in its folder)."""
import glob
import json
import os
from pathlib import Path

R = Path("/work/r27")
out = {
    "note": "Random weights (--load-format dummy, --dummy-logits peaked): speed and memory "
    "only, not speech quality.",
    "date": "2026-12-03",
    "server_flags": "--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 "
    "--boost-frames 64 --async-scheduling --first-chunk-deadline 0.15",
    "bench": "--ramp 8 --lengths short --max-new-tokens 216 --ignore-eos --warmup 2 "
    "--duration 30 --timeout 40 --processes 2",
    "request_columns": ["start_s", "ttfa_s", "stall_s"],
    "calls": {},
    "runs": {},
}
for call in sorted(os.listdir(R)):
    out["calls"][call] = {"log": (R / call / "log.txt").read_text().splitlines()}
    for extra in ("probe.txt", "cpu.txt"):
        if (R / call / extra).exists():
            out["calls"][call][extra] = (R / call / extra).read_text().splitlines()
out["calls"]["c6"] = {  # a probe right after call 5 (no files came back; its output)
    "command": "python3 -m fishserve probe",
    "log": ["host probe: 12.3 ms (higher is slower)",
            "device probe: 0.91 us per graph kernel, 803 bf16 TFLOP/s, SM clock 1980/1980 MHz, "
            "power limit 700 W, 36 C"],
}
for folder in sorted(glob.glob(f"{R}/c*/*/")):
    run = os.path.basename(folder.rstrip("/"))
    code = "7a52978" if run in ("P1", "B1", "B2", "B3") else "ea6f35e (server as run)"
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
    entry = {"call": Path(folder).parent.name, "code": code, "levels": levels,
             "requests": requests}
    for end in ("health_start", "health_end"):
        if (Path(folder) / f"{end}.json").exists():
            entry[end] = json.loads((Path(folder) / f"{end}.json").read_text())
    log = Path(folder) / "serve.log"
    if log.exists():
        entry["gc_warnings"] = [x for x in log.read_text().splitlines() if "garbage" in x]
    out["runs"][run] = entry
Path("docs/data/e2e_round27.json").write_text(json.dumps(out, separators=(",", ":")))
print({k: [lv["label"] for lv in v["levels"]] for k, v in out["runs"].items()})
