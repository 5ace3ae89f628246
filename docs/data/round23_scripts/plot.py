"""docs/img/e2e_round23.png: boost steps for young streams against none, one H200 machine
(random weights)."""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

data = json.loads(Path("docs/data/e2e_round23.json").read_text())
GROUPS = {  # label: runs (levels pooled, in level order)
    "no boost (N0, N1)": (["N0", "N1"], "ko-"),
    "boost 12 (B12)": (["B12"], "v:"),
    "boost 20 (B20)": (["B20"], "^:"),
    "boost 32 (B32)": (["B32"], "s-"),
    "boost 32 (B32b)": (["B32b"], "s--"),
    "boost 48 (B48)": (["B48"], "d-"),
    "boost 48 (B48b)": (["B48b"], "d--"),
    "boost 64 (B64)": (["B64"], "o-"),
    "boost 64 (B64b)": (["B64b"], "o--"),
    "boost 64 (B64c, second lease)": (["B64c"], "P"),
}
fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
for label, (runs, style) in GROUPS.items():
    levels = sorted(
        (s for run in runs for s in data["runs"][run]["levels"]), key=lambda s: s["level"]
    )
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
            title="Streams that ran dry")
axes[2].set(xlabel="concurrent streams", ylabel="slowest stream's RTF", title="Slowest stream")
axes[0].legend(fontsize=7)
fig.suptitle("One H200, random weights (speed only, not speech quality), sync, --engine-sms 56, "
             "216 frames each", fontsize=9)
fig.tight_layout()
fig.savefig("docs/img/e2e_round23.png", dpi=110)
