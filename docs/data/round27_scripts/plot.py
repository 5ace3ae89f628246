"""docs/img/e2e_round27.png from docs/data/e2e_round27.json (needs matplotlib)."""
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

d = json.load(open("docs/data/e2e_round27.json"))
fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
styles = {"A2": ("tab:blue", "-"), "B2": ("tab:orange", "-"), "A3": ("tab:blue", "--"),
          "B3": ("tab:orange", "--"), "A5": ("tab:blue", ":")}
for run, (color, ls) in styles.items():
    level = "704" if run in ("A2", "B2") else "832"
    bins = defaultdict(lambda: [0, 0])
    for start, _, stall in d["runs"][run]["requests"][level]:
        b = int(start // 3) * 3
        bins[b][0] += 1
        bins[b][1] += bool(stall)
    xs = sorted(bins)
    tree = "new" if run.startswith("A") else "before"
    left.plot([x + 1.5 for x in xs], [bins[x][1] / bins[x][0] for x in xs], color=color, ls=ls,
              marker="o", ms=3, label=f"{run} ({tree}) at {level}")
left.set_xlabel("request start within the level (s)")
left.set_ylabel("share of streams that ran dry")
left.set_title("Streams with a gap, by when they started")
left.legend(fontsize=8)
order = ["A1", "B1", "A2", "B2", "A3", "A4", "B3", "A5"]
labels, stalled, colors = [], [], []
for run in order:
    entry = d["runs"][run]
    for lv in sorted(entry["levels"], key=lambda x: int(x["label"])):
        labels.append(f"{run}\n{lv['label']}")
        stalled.append(lv["stalled_streams"] / max(lv["requests"], 1))
        ok = lv["stalled_streams"] == 0 and lv["ttfa_s"]["p99"] <= 0.3
        colors.append("tab:green" if ok else ("tab:blue" if run[0] == "A" else "tab:orange"))
right.bar(range(len(labels)), stalled, color=colors)
for i, c in enumerate(colors):
    if c == "tab:green":
        right.text(i, 0.02, "pass", ha="center", fontsize=8, color="tab:green", rotation=90)
right.set_xticks(range(len(labels)), labels, fontsize=7)
right.set_ylim(0, 1.1)
right.set_ylabel("share of streams that ran dry")
right.set_title("Every level, in the order run on one lease")
fig.suptitle("Round 27, one H200: new tree (A, blue) vs main before (B, orange); random "
             "weights, speed only", fontsize=10)
fig.tight_layout()
fig.savefig("docs/img/e2e_round27.png", dpi=110)
