"""docs/img/e2e_round17.png from docs/data/e2e_round17.json (run from the repository root)."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

d = json.load(open("docs/data/e2e_round17.json"))
fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.2))
b2 = b.twinx()
styles = {
    "R1": ("s-", "tab:blue", "R1: main (d9b76db)"),
    "R3": ("s", "tab:cyan", "R3: main again"),
    "C1": ("^-", "tab:orange", "C1: main, first chunk 8 frames"),
    "R2": ("o-", "tab:red", "R2: speculative codes (branch)"),
}
for run, (style, color, label) in styles.items():
    lv = sorted(
        (s for s in d["runs"][run]["levels"] if not s["label"].endswith("b")),
        key=lambda s: s["level"],
    )
    x = [s["level"] for s in lv]
    a.plot(x, [s["ttfa_s"]["p99"] for s in lv], style, color=color, label=label)
    b.plot(x, [s["steps_per_s"] for s in lv], style, color=color, label=f"{run}: steps/s")
    b2.plot(x, [s["frames_per_s"] for s in lv], style.replace("-", "--"), color=color,
            alpha=0.6, label=f"{run}: frames/s (right)")
a.axhline(0.3, color="grey", lw=0.8, ls=":")
a.set_xlabel("concurrent streams")
a.set_ylabel("TTFA p99 (s)")
a.set_title("TTFA p99 (the bar: 0.3 s)")
a.legend(fontsize=8)
b.set_xlabel("concurrent streams")
b.set_ylabel("engine steps/s (solid)")
b2.set_ylabel("delivered frames/s (dashed)")
b.set_title("engine steps/s and delivered frames/s")
b.legend(fontsize=7, loc="lower left")
b2.legend(fontsize=7, loc="upper right")
for run, color in (("R1", "tab:blue"), ("R3", "tab:cyan"), ("R2", "tab:red")):
    reqs = [r for r in d["runs"][run]["requests"]["448"] if r[1] is not None]
    c.scatter([r[0] for r in reqs], [r[1] for r in reqs], s=3, color=color, alpha=0.4, label=run)
c.axhline(0.3, color="grey", lw=0.8, ls=":")
c.set_xlabel("request start (s into the level)")
c.set_ylabel("TTFA (s)")
c.set_title("448 streams: TTFA within the level")
c.legend(fontsize=8)
fig.suptitle("Round 17: main with sampled busy timers and one staged upload; speculative codes (branch) "
             "(random weights: speed only, not speech quality)", fontsize=10)
fig.tight_layout()
fig.savefig("docs/img/e2e_round17.png", dpi=110)
