"""docs/img/e2e_round21.png: the engine on SMs of its own (engine_sms), its CUDA graphs shared
with the decoder's SMs or confined to its own (H200, random weights)."""
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

new = json.loads(Path("docs/data/e2e_round21.json").read_text())
old = json.loads(Path("docs/data/e2e_round20.json").read_text())


def points(run: dict) -> list[tuple[float, float, float, float]]:
    """(streams, TTFA p99 s, % of streams with a gap, engine steps/s) per level."""
    out = [
        (s["level"], s["ttfa_s"]["p99"], 100 * s["stalled_streams"] / s["requests"],
         s["steps_per_s"])
        for s in run["levels"]
    ]
    for level, line in run.get("summary_only", {}).items():
        n = int(re.search(r"n=(\d+)", line)[1])
        p99 = float(re.search(r"ttfa=[\d.]+/[\d.]+/([\d.]+)", line)[1])
        stalled = int(re.search(r"stalled=(\d+)", line)[1])
        steps = float(re.search(r"steps=([\d.]+)", line)[1])
        out.append((float(level), p99, 100 * stalled / n, steps))
    return sorted(out)


series = {"E4 (round 20): decoder on 72 shared SMs": points(old["runs"]["E4"])}
labels = {
    "B1": "B1: decoder on 72 shared SMs",
    "G1": "G1: engine 56 SMs, graphs anywhere",
    "G2": "G2: engine 56 SMs, graphs anywhere",
    "G3": "G3: engine 48 SMs, graphs anywhere",
    "G4": "G4: engine 56 SMs, graphs confined",
    "G5": "G5: engine 56 SMs, graphs confined",
}
for run, label in labels.items():
    series[label] = points(new["runs"][run])
fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
for name, pts in series.items():
    style = "s--" if "confined" in name else ("o-" if "engine" in name else "^:")
    for ax, i in zip(axes, (1, 2, 3), strict=True):
        ax.plot([p[0] for p in pts], [p[i] for p in pts], style, label=name)
axes[0].axhline(0.3, color="grey", ls="--", lw=1)
axes[0].set(xlabel="concurrent streams", ylabel="TTFA p99 (s)", title="Time to first audio, p99")
axes[1].set(xlabel="concurrent streams", ylabel="% of streams with a gap",
            title="Streams that ran dry")
axes[2].set(xlabel="concurrent streams", ylabel="engine steps per second",
            title="Engine steps per second")
axes[0].legend(fontsize=7)
fig.suptitle("H200, random weights (speed only, not speech quality), sync, 216 frames each",
             fontsize=9)
fig.tight_layout()
fig.savefig("docs/img/e2e_round21.png", dpi=110)
