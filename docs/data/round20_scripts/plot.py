"""docs/img/e2e_round20.png: capacity after round 19's faster decoder head (H200, random weights)."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

new = json.load(open("docs/data/e2e_round20.json"))
old = json.load(open("docs/data/e2e_round18.json"))
series = {"S1 (round 18: old head, sync, 96 SMs)": old["runs"]["S1"]["levels"]}
for run in ("E2", "E3", "E4", "A5"):
    series[f"{run}: {new['code'][run].split(' ', 2)[2]}"] = new["runs"][run]["levels"]
fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.4))
for name, levels in series.items():
    levels = sorted(levels, key=lambda s: s["level"])
    x = [s["level"] for s in levels]
    a.plot(x, [s["ttfa_s"]["p99"] for s in levels], "o-", label=name)
    b.plot(x, [s["stalled_streams"] / s["requests"] * 100 for s in levels], "o-", label=name)
a.axhline(0.3, color="grey", ls="--", lw=1)
a.set(xlabel="concurrent streams", ylabel="TTFA p99 (s)", title="Time to first audio, p99")
b.set(xlabel="concurrent streams", ylabel="% of streams with a gap", title="Streams that ran dry")
a.legend(fontsize=7)
bench = new["bench_decoder_new_frames_per_s"]
before = new["bench_decoder_before_round19"]
keys = list(bench)
c.bar([i - 0.2 for i in range(len(keys))], [before.get(k, 0) for k in keys], 0.4,
      label="before round 19")
c.bar([i + 0.2 for i in range(len(keys))], [bench[k] for k in keys], 0.4, label="fc7822e")
c.set_xticks(range(len(keys)), keys, rotation=30, ha="right")
c.set(ylabel="new frames per second", title="bench-decoder, Triton head, bf16")
c.legend(fontsize=8)
fig.tight_layout()
fig.savefig("docs/img/e2e_round20.png", dpi=110)
