"""docs/data/e2e_round31.json from round 31's device calls (their $OUT folders unpacked under
/work/r31/c1 ... c4; each call's res.tgz unpacked in its folder; ts.txt: the metrics sampler
of run33b.sh and run33c.sh)."""
import glob
import json
import os
import re
from pathlib import Path

R = Path("/work/r31")
LEASE = {"c1": 1, "c2": 2, "c3": 3, "c4": 4}
FLAGS = {
    "E": "--max-decode-batch 32 --decoder-call-overhead 256 (round 30's best; the README's)",
    "R": "E + --rebuffer-frames 24",
    "R8": "E + --rebuffer-frames 24 --first-chunk-frames 8",
    "G": "R8 + --realtime-admission 1.1 (first version: a rate gate, replaced)",
    "H": "R8 + --realtime-admission 1.15 (first version: a rate gate, replaced)",
    "I": "R8 + --realtime-admission 1.15 (as committed: a cap on running streams)",
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
    "code": "call 1: 9355a9f; call 2: 9355a9f plus the first version of realtime_admission (a gate on each stream's measured frame rate); calls 3-4: 4b625d4",
    "sampler_columns": "calls 2-3 (calls.*.metrics_1s): seconds since the call's start, "
    "then the server's /metrics every second: running, waiting, generation_frames_total, "
    "engine_steps_total, admission_held_total, stream_frame_rate",
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
    if (R / call / "ts.txt").exists():
        out["calls"][call]["metrics_1s"] = [
            [int(p[0])] + [float(x.split("=")[1]) for x in p[1:]]
            for p in (line.split() for line in (R / call / "ts.txt").read_text().splitlines())
        ]
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
             "flags": FLAGS[run], "levels": levels, "requests": requests}
    for end in ("health_start", "health_end"):
        if (Path(folder) / f"{end}.json").exists():
            entry[end] = json.loads((Path(folder) / f"{end}.json").read_text())
    out["runs"][f"{entry['call']}:{run}"] = entry  # E ran in calls 1, 2 and 4
Path("docs/data/e2e_round31.json").write_text(json.dumps(out, separators=(",", ":")))
print({k: [lv["label"] for lv in v["levels"]] for k, v in out["runs"].items()})
