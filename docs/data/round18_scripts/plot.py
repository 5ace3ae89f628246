"""docs/img/e2e_round18.png from docs/data/e2e_round18.json (run from the repository root)."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

d = json.load(open("docs/data/e2e_round18.json"))
fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.4))
groups = {  # runs drawn alike: (marker, colour, label)
    "sync (S1)": (["S1"], "s", "tab:blue"),
    "async (A1-A4)": (["A1", "A2", "A3", "A4"], "o", "tab:red"),
    "paced 2 s, sync (P1, branch)": (["P1"], "^", "tab:green"),
    "paced 2 s, async (P2, branch)": (["P2"], "v", "tab:olive"),
}
for label, (runs, marker, color) in groups.items():
    pts = [s for r in runs for s in d["runs"][r]["levels"]]
    x = [s["level"] for s in pts]
    a.scatter(x, [s["ttfa_s"]["p99"] for s in pts], marker=marker, color=color, label=label)
    b.scatter(x, [s["rtf_max"] for s in pts], marker=marker, color=color, label=label)
    c.scatter(x, [s["stalled_streams"] + 0.5 for s in pts], marker=marker, color=color,
              label=label)
    for ax, key in ((a, lambda s: s["ttfa_s"]["p99"]), (b, lambda s: s["rtf_max"])):
        best = {}
        for s in pts:  # the median of the runs at each level joins the line
            best.setdefault(s["level"], []).append(key(s))
        xs = sorted(best)
        ax.plot(xs, [sorted(best[v])[len(best[v]) // 2] for v in xs], color=color, alpha=0.5)
a.axhline(0.3, color="grey", lw=0.8, ls=":")
a.set_ylim(0.2, 1.0)
a.set_xlabel("concurrent streams")
a.set_ylabel("TTFA p99 (s)")
a.set_title("TTFA p99 per run (the bar: 0.3 s; line: median)")
a.legend(fontsize=8)
for y in (0.5, 1.0):
    b.axhline(y, color="grey", lw=0.8, ls=":")
b.set_xlabel("concurrent streams")
b.set_ylabel("slowest stream's RTF")
b.set_title("slowest RTF per run (0.5 and 1.0 marked)")
c.set_yscale("log")
c.set_xlabel("concurrent streams")
c.set_ylabel("streams with a gap + 0.5 (log)")
c.set_title("streams that ran dry (0 drawn at 0.5)")
fig.suptitle("Round 18: asynchronous scheduling against sync; pacing streams to 2 s ahead of "
             "real time (random weights: speed only, not speech quality)", fontsize=10)
fig.tight_layout()
fig.savefig("docs/img/e2e_round18.png", dpi=110)
