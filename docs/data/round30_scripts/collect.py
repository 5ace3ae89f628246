"""docs/data/e2e_round30.json from round 30's device calls (their $OUT folders unpacked under
/work/r30/c1 ... c3; each call's res.tgz unpacked in its folder)."""
import glob
import json
import os
import re
from pathlib import Path

R = Path("/work/r30")
LEASE = {"c1": 1, "c2": 2, "c3": 3}
FLAGS = {
    "A": "--max-decode-batch 16 (round 28's flags)",
    "D": "--max-decode-batch 32",
    "E": "--max-decode-batch 32 --decoder-call-overhead 256",
    "F": "--max-decode-batch 16 --decoder-call-overhead 256",
}
HISTOGRAMS = {
    "ttfa_s": "fishserve:time_to_first_audio_seconds",
    "queue_s": "fishserve:request_queue_time_seconds",
    "first_chunk_decode_s": "fishserve:first_chunk_decode_seconds",
    "first_chunk_frames": "fishserve:first_chunk_frames",
}
out = {
    "note": "Random weights (--load-format dummy, --dummy-logits peaked): speed and memory "
    "only, not speech quality.",
    "date": "2026-12-03",
    "code": "261dc9d (the decoder_call_overhead setting)",
    "server_flags": "--early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 "
    "--async-scheduling --stream-pipeline core --first-chunk-deadline 0.15, and each run's "
    "(runs.*.flags)",
    "bench": "--ramp 8 --lengths short --max-new-tokens 216 --ignore-eos --warmup 2 "
    "--duration 30 --timeout 40 --processes 2",
    "request_columns": ["start_s", "ttfa_s", "stall_s"],
    "first_chunk_columns": "server-side means per level from /metrics (HTTP process): "
    "ttfa_s, queue_s (arrival to first frame), first_chunk_decode_s (first chunk handed to "
    "the decoder to its audio), first_chunk_frames",
    "calls": {},
    "runs": {},
}


def metric_levels(path: Path) -> list[dict]:
    """Per-level means from a run's metrics.txt (cumulative snapshots, one after each level,
    concatenated in file-name order: sorted by count they are in run order)."""
    blocks, current = [], {}
    for line in path.read_text().splitlines():
        if m := re.match(r"(fishserve:\w+?)_(sum|count) (\S+)", line):
            key = f"{m[1]}_{m[2]}"
            if key in current:
                blocks.append(current)
                current = {}
            current[key] = float(m[3])
    blocks.append(current)
    blocks.sort(key=lambda b: b[HISTOGRAMS["ttfa_s"] + "_count"])
    rows, before = [], {}
    for block in blocks:
        diff = {k: v - before.get(k, 0.0) for k, v in block.items()}
        before = block
        rows.append({"n": int(diff[HISTOGRAMS["ttfa_s"] + "_count"])} | {
            name: round(diff[h + "_sum"] / diff[h + "_count"], 4)
            for name, h in HISTOGRAMS.items()})
    return rows


for call in sorted(os.listdir(R)):
    out["calls"][call] = {"lease": LEASE[call],
                          "log": (R / call / "log.txt").read_text().splitlines()}
for folder in sorted(glob.glob(f"{R}/c*/*/")):
    run = os.path.basename(folder.rstrip("/"))
    log = (Path(folder).parent / "log.txt").read_text()
    # levels in run order (split.py's lines at the end name them again)
    order = list(dict.fromkeys(re.findall(rf"^\s*({run}_l\w+) L", log, flags=re.M)))
    levels, requests = [], {}
    for name, means in zip(order, metric_levels(Path(folder) / "metrics.txt"), strict=True):
        bench = json.loads((Path(folder) / f"{name}.json").read_text())
        label = name[len(run) + 2:]
        level = dict(bench["levels"][0], label=label, first_chunk=means)
        assert means["n"] >= level["requests"], (name, means["n"], level["requests"])
        level["bench_host_probe_ms"] = bench["meta"].get("host_probe_ms")
        levels.append(level)
        requests[label] = [
            [round(r["start_s"], 3), r["ttfa_s"] and round(r["ttfa_s"], 4),
             r["stall_s"] and round(r["stall_s"], 5)]
            for r in bench["requests"]
        ]
    entry = {"call": Path(folder).parent.name, "lease": LEASE[Path(folder).parent.name],
             "flags": FLAGS[run[0]], "levels": levels, "requests": requests}
    for end in ("health_start", "health_end"):
        if (Path(folder) / f"{end}.json").exists():
            entry[end] = json.loads((Path(folder) / f"{end}.json").read_text())
    out["runs"][f"{entry['call']}:{run}"] = entry  # E ran in calls c2 and c3
Path("docs/data/e2e_round30.json").write_text(json.dumps(out, separators=(",", ":")))
print({k: [lv["label"] for lv in v["levels"]] for k, v in out["runs"].items()})
