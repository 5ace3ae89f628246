"""docs/img/e2e_round28.png from docs/data/e2e_round28.json (needs matplotlib)."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

d = json.load(open("docs/data/e2e_round28.json"))
ORDER = [("H1", ["768", "896", "960", "1024"]), ("H3", ["832", "896", "960"]), ("C3", ["896"]),
         ("C4", ["960", "1024", "896"]), ("H4", ["896"]), ("C5", ["1000", "1024"])]
COLOR = {"H": "tab:purple", "C": "tab:blue"}
fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
labels, stalled, colors, passes = [], [], [], []
for run, levels in ORDER:
    by_label = {lv["label"]: lv for lv in d["runs"][run]["levels"]}
    for name in levels:
        lv = by_label[name]
        labels.append(f"{run}\n{name}")
        stalled.append(lv["stalled_streams"] / max(lv["requests"], 1))
        passes.append(lv["stalled_streams"] == 0 and lv["ttfa_s"]["p99"] <= 0.3)
        colors.append("tab:green" if passes[-1] else COLOR[run[0]])
        p99 = lv["ttfa_s"]["p99"]
        marker = "o" if lv["stalled_streams"] == 0 else "x"
        right.scatter(int(name), p99, color=COLOR[run[0]], marker=marker, s=40)
        right.annotate(run, (int(name), p99), fontsize=7, xytext=(4, 2), textcoords="offset points")
left.bar(range(len(labels)), [max(s, 0.004) for s in stalled], color=colors)
for i, ok in enumerate(passes):
    if ok:
        left.text(i, 0.03, "pass", ha="center", fontsize=8, color="tab:green", rotation=90)
left.set_xticks(range(len(labels)), labels, fontsize=7)
left.set_ylim(0, 1.0)
left.set_ylabel("share of streams that ran dry")
left.set_title("Every level in the order run (H: relay, C: core pipeline; green: passed)")
right.axhline(0.3, color="gray", ls="--", lw=1)
right.text(760, 0.31, "TTFA p99 bound 0.3 s", fontsize=8, color="gray")
right.set_yscale("log")
right.set_xlabel("concurrent streams")
right.set_ylabel("TTFA p99 (s, log)")
right.set_title("TTFA p99 per level (o: no stream ran dry, x: some did)")
right.scatter([], [], color=COLOR["C"], label="core pipeline (default)")
right.scatter([], [], color=COLOR["H"], label="relay (stream_pipeline http)")
right.legend(fontsize=8, loc="upper left")
fig.suptitle("Round 28 on the H200 (H1: first lease, before the channel fix; the rest: a "
             "second lease): random weights, speed only", fontsize=10)
fig.tight_layout()
fig.savefig("docs/img/e2e_round28.png", dpi=110)
