"""docs/data/e2e_round20.json from runs E1-E4 and A5 (their bench.json files copied to
/tmp/dd/<run>/<run>_l<level>.json from the device's $OUT) plus the bench-decoder tables."""
import glob
import json
import os

MAIN = "fc7822e (main)"
F = "--max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
out = {
    "note": "Random weights (--load-format dummy, --dummy-logits peaked): speed and memory "
    "only, not speech quality.",
    "date": "2026-12-02",
    "machine": "one NVIDIA H200 (server and load generator on the same machine)",
    "code": {
        "E1": MAIN + " sync --decoder-sms 96 (GPU pytest running beside it)",
        "E2": MAIN + " sync --decoder-sms 96",
        "E3": MAIN + " sync --decoder-sms 72",
        "A5": MAIN + " --async-scheduling --decoder-sms 72",
        "E4": MAIN + " sync --decoder-sms 72",
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
        bench = json.load(open(path))
        levels.append(dict(bench["levels"][0], label=name))
        requests[name] = [
            [round(r["start_s"], 3), r["ttfa_s"] and round(r["ttfa_s"], 4),
             r["stall_s"] and round(r["stall_s"], 3)]
            for r in bench["requests"]
        ]
    out["runs"][run] = {"levels": levels, "requests": requests}
# E3 at 576 streams: its bench.json did not come back (the device's file-count limit); the
# summary line summ.py printed on the device.
out["runs"]["E3"]["summary_only"] = {
    "576": "n=2125 ok=2125 err=0 inflight=484 ttfa=0.299/0.566/0.824 rtf90=1.02 max=1.06 "
    "stalled=1031 fps=13423 steps=37.3/354 busy=0.79/0.60 f/call=120 f/job=12.6"
}
# bench-decoder, bf16, --modes triton: (jobs x new frames) -> new frames/s, this round and
# the last one measured before round 19's head change (§2).
out["bench_decoder_new_frames_per_s"] = {
    "1x20": 11132, "16x20": 62155, "32x20": 68166, "8x64": 72519, "32x64": 84505,
    "whole 1x646": 75778, "whole 8x646": 74229,
}
out["bench_decoder_before_round19"] = {  # §2 and §6.9 (0bd24c3), §2 whole clips
    "1x20": 10078, "16x20": 34899, "32x20": 37531, "8x64": 45190, "32x64": 49432,
    "whole 8x646": 54284,
}
json.dump(out, open("docs/data/e2e_round20.json", "w"), separators=(",", ":"))
