"""docs/data/e2e_round19.json from runs D1 and D2 (unpacked under /tmp/dd/<run> from the
device's D.tgz) plus the head A/B and fidelity numbers printed by head_ab.py / fidelity.py."""
import glob
import json
import os

CODE = "b61ffc0 (main) with --async-scheduling"
out = {
    "note": "Random weights (--load-format dummy, --dummy-logits peaked): speed, memory and "
    "numerical fidelity only, not speech quality.",
    "date": "2026-12-02",
    "machine": "one NVIDIA H200 (server and load generator on the same machine)",
    "code": {"D1": CODE + " --decoder-sms 112", "D2": CODE + " --decoder-sms 104"},
    "server_flags": "--max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12",
    "bench": "--ramp 8 --lengths short --max-new-tokens 216 --ignore-eos --warmup 2 "
    "--duration 30 --timeout 40 --processes 2",
    "request_columns": ["start_s", "ttfa_s"],
    "runs": {},
}
for run in out["code"]:
    levels, requests = [], {}
    for path in sorted(glob.glob(f"/tmp/dd/{run}/{run}_l*.json")):
        name = os.path.basename(path)[len(run) + 2 : -5]
        bench = json.load(open(path))
        levels.append(dict(bench["levels"][0], label=name))
        requests[name] = [
            [round(r["start_s"], 3), r["ttfa_s"] and round(r["ttfa_s"], 4)]
            for r in bench["requests"]
        ]
    out["runs"][run] = {"levels": levels, "requests": requests}
out["head_ms_per_call"] = {  # head_ab.py: (batch, new frames) -> [before, after] ms
    "1x10": [1.498, 1.093], "16x20": [6.543, 3.884], "32x20": [12.347, 7.369],
    "16x40": [12.102, 7.213], "16x64": [18.737, 11.310],
}
out["bf16_rel_error_vs_fp32"] = {"torch_head": 0.11666, "triton_before": 0.08798,
                                 "triton_after": 0.08109}  # fidelity.py
json.dump(out, open("docs/data/e2e_round19.json", "w"), indent=1)
