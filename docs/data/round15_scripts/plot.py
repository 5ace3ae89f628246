"""docs/img/e2e_round15.png from docs/data/e2e_round15.json (run from the repository root)."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

d = json.load(open("docs/data/e2e_round15.json"))
fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.2))
styles = {"Q1": ("o-", "tab:blue", "Q1: 15 s levels"), "Q2": ("s-", "tab:green", "Q2: 30 s levels"),
          "Q3": ("D", "tab:olive", "Q3: 25 s, probe on"),
          "G1": ("^--", "tab:orange", "G1: GIL switch 0.1 ms"), "G2": ("v--", "tab:red", "G2: GIL switch 0.02 ms")}
for run, (style, color, label) in styles.items():
    lv = d["runs"][run]["levels"]
    x = [s["level"] for s in lv]
    a.plot(x, [s["ttfa_s"]["p99"] for s in lv], style, color=color, label=label)
    b.plot(x, [s["stalled_streams"] / s["requests"] for s in lv], style, color=color, label=label)
a.axhline(0.3, color="grey", lw=0.8, ls=":")
a.set_yscale("log")
a.set_xlabel("concurrent streams")
a.set_ylabel("TTFA p99 (s)")
a.set_title("TTFA p99 (the bar: 0.3 s)")
a.legend(fontsize=8)
b.set_xlabel("concurrent streams")
b.set_ylabel("share of streams with a gap")
b.set_title("stalled streams (the bar: none)")
for level, color in (("384", "tab:green"), ("448", "tab:purple")):
    reqs = [r for r in d["runs"]["Q2"]["requests"][level] if r[1] is not None]
    c.scatter([r[0] for r in reqs], [r[1] for r in reqs], s=4, color=color, label=f"{level} streams")
c.axhline(0.3, color="grey", lw=0.8, ls=":")
c.set_xlabel("request start (s into the level)")
c.set_ylabel("TTFA (s)")
c.set_title("run Q2: TTFA within a level")
c.legend(fontsize=8)
fig.suptitle("Round 15, fixed load generator (random weights: speed only, not speech quality)",
             fontsize=10)
fig.tight_layout()
fig.savefig("docs/img/e2e_round15.png", dpi=110)
