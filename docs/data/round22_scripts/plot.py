"""docs/img/e2e_round22.png: first-chunk deadline and reserved engine SMs at the capacity edge,
on two H200 machines (random weights)."""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

data = json.loads(Path("docs/data/e2e_round22.json").read_text())
LABELS = {
    "H1": "H1 (A): 56 SMs, deadline 0.15", "H2": "H2 (A): 64 SMs, deadline 0.17",
    "H1b": "H1b (B): 56 SMs, deadline 0.15", "H3": "H3 (B): 56 SMs, deadline 0.13",
    "G6": "G6 (B): 56 SMs, deadline 0.17", "H1c": "H1c (B): 56 SMs, deadline 0.15",
    "G7": "G7 (B): 56 SMs, deadline 0.17", "G8": "G8 (B): 56 SMs, deadline 0.17",
}
fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
for run, label in LABELS.items():
    levels = sorted(data["runs"][run]["levels"], key=lambda s: s["level"])
    x = [s["level"] for s in levels]
    ys = (
        [s["ttfa_s"]["p99"] for s in levels],
        [100 * s["stalled_streams"] / s["requests"] for s in levels],
        [s["steps_per_s"] for s in levels],
    )
    style = ("s--" if "(A)" in label else "o-") if "0.17" in label else ("^:" if "(A)" in label else "d-.")
    for ax, y in zip(axes, ys, strict=True):
        ax.plot(x, y, style, label=label)
axes[0].axhline(0.3, color="grey", ls="--", lw=1)
axes[0].set(xlabel="concurrent streams", ylabel="TTFA p99 (s)", title="Time to first audio, p99")
axes[1].set(xlabel="concurrent streams", ylabel="% of streams with a gap",
            title="Streams that ran dry")
axes[2].set(xlabel="concurrent streams", ylabel="engine steps per second",
            title="Engine steps per second")
axes[0].legend(fontsize=7)
fig.suptitle("H200 machines A and B, random weights (speed only, not speech quality), sync, "
             "216 frames each", fontsize=9)
fig.tight_layout()
fig.savefig("docs/img/e2e_round22.png", dpi=110)
