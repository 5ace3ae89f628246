"""docs/img/e2e_round24.png: boost steps with asynchronous scheduling against sync, one H200
(random weights)."""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

data = json.loads(Path("docs/data/e2e_round24.json").read_text())
GROUPS = {  # label: runs (levels pooled, in level order), style
    "sync, deadline 0.17 (B64)": (["B64"], "ks-"),
    "async, deadline 0.17 (A64)": (["A64"], "o-"),
    "async, deadline 0.17 (A64b, A64c)": (["A64b", "A64c"], "o--"),
    "async, 64 engine SMs (E64)": (["E64"], "x"),
    "async, deadline 0.15 (D15, D15b)": (["D15", "D15b"], "d-"),
}
fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
for label, (runs, style) in GROUPS.items():
    levels = sorted(
        (s for run in runs if run in data["runs"] for s in data["runs"][run]["levels"]),
        key=lambda s: s["level"],
    )
    if not levels:
        continue
    x = [s["level"] for s in levels]
    ys = (
        [s["ttfa_s"]["p99"] for s in levels],
        [100 * s["stalled_streams"] / s["requests"] for s in levels],
        [s["rtf_max"] for s in levels],
    )
    for ax, y in zip(axes, ys, strict=True):
        ax.plot(x, y, style, label=label)
axes[0].axhline(0.3, color="grey", ls="--", lw=1)
axes[2].axhline(1.0, color="grey", ls="--", lw=1)
axes[0].set(xlabel="concurrent streams", ylabel="TTFA p99 (s)", title="Time to first audio, p99",
            yscale="log")
axes[1].set(xlabel="concurrent streams", ylabel="% of streams with a gap",
            title="Streams that ran dry", yscale="symlog")
axes[2].set(xlabel="concurrent streams", ylabel="slowest stream's RTF", title="Slowest stream")
axes[0].legend(fontsize=7)
fig.suptitle("One H200, random weights (speed only, not speech quality), --boost-frames 64, "
             "216 frames each", fontsize=9)
fig.tight_layout()
fig.savefig("docs/img/e2e_round24.png", dpi=110)
