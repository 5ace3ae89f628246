"""docs/img/e2e_round30.png from docs/data/e2e_round30.json (needs matplotlib): each level's
TTFA p99 against the 300 ms bound, the time course of two runs at 1,000 streams with the same
flags (one real time, one collapsed from its ramp), and the collapse's signature (decoder
frames per chunk against engine steps per second)."""
import json

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

data = json.load(open("docs/data/e2e_round30.json"))
MARK = {"A": "o", "D": "s", "E": "*", "F": "^"}
fig, (ttfa, course, sig) = plt.subplots(1, 3, figsize=(17, 4.8))
for key, run in data["runs"].items():
    call, name = key.split(":")
    label = f"{name} ({call}, lease {run['lease']}): {run['flags']}"
    xs = [lv["level"] for lv in run["levels"]]
    p99 = [lv["ttfa_s"]["p99"] for lv in run["levels"]]
    ok = [lv["all_realtime"] and lv["ttfa_s"]["p99"] <= 0.3 for lv in run["levels"]]
    ttfa.plot(xs, p99, marker=MARK[name], ms=9, label=label)
    ttfa.scatter([x for x, g in zip(xs, ok) if g], [y for y, g in zip(p99, ok) if g],
                 s=220, facecolors="none", edgecolors="green", zorder=3)
    sig.scatter([lv["decoder_frames_per_job"] for lv in run["levels"]],
                [lv["steps_per_s"] for lv in run["levels"]], marker=MARK[name], s=70,
                c=["green" if g else "red" for g in ok])
ttfa.axhline(0.3, color="gray", ls="--")
ttfa.set(xlabel="concurrent streams", ylabel="TTFA p99 (s)", yscale="log",
         title="Each level (green ring: all real time, TTFA p99 <= 0.3 s)")
ttfa.legend(fontsize=7)
for key, color in (("c2:E", "green"), ("c3:E", "red")):
    rows = np.array([r for r in data["runs"][key]["requests"]["1000"] if r[1] is not None],
                    dtype=float)
    bins = [(t, rows[(rows[:, 0] >= t) & (rows[:, 0] < t + 2)]) for t in range(0, 34, 2)]
    bins = [(t + 1, b) for t, b in bins if len(b)]
    stalled = [np.mean(np.nan_to_num(b[:, 2]) > 0) for _, b in bins]
    course.plot([t for t, _ in bins], stalled, color=color, marker="o",
                label=f"{key} at 1,000: share of streams with a gap")
    ttfa_p = [np.percentile(b[:, 1], 99) for _, b in bins]
    course.plot([t for t, _ in bins], ttfa_p, color=color, ls=":", label=f"{key}: TTFA p99 (s)")
course.set(xlabel="request start (s into the level)", ylim=(0, 2.3),
           title="Same flags (E), two leases, 1,000 streams")
course.legend(fontsize=7)
sig.set(xlabel="decoder frames per chunk (job)", ylabel="engine steps per second",
        title="Collapse: short chunks, slow steps (red: not real time)")
fig.text(0.5, 0.005, "Random weights: speed only, not speech quality. Data: "
         "docs/data/e2e_round30.json", ha="center", fontsize=8)
fig.tight_layout(rect=(0, 0.03, 1, 1))
fig.savefig("docs/img/e2e_round30.png", dpi=110)
