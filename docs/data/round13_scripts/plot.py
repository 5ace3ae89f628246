"""docs/img/e2e_round13.png from docs/data/e2e_round13.json (run from the repository root)."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

d = json.load(open("docs/data/e2e_round13.json"))
fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
for key, label in [("call3_engine_base_2be5d02", "2be5d02 (session start)"),
                   ("call3_engine_new_7ef8ba7", "7ef8ba7 (compiled slots, lighter host)")]:
    rows = d[key]["results"]
    a.plot([r["batch"] for r in rows], [r["frames_per_s"] for r in rows], "o-", label=label)
a.axhline(21500, ls="--", c="gray", lw=1)
a.text(8, 22500, "1,000 real-time streams", color="gray", fontsize=8)
a.set_xscale("log", base=2)
a.set_xlabel("decode batch (sequences)")
a.set_ylabel("frames/s (engine alone)")
a.set_title("bench-engine, CUDA graphs, same lease")
a.legend(fontsize=8)
levels = [s for v in d["call3_e2e_C1"].values() for s in v["levels"]]
x = [s["level"] for s in levels]
b.plot(x, [s["ttfa_s"]["p99"] for s in levels], "o-", label="TTFA p99 (s)")
b.plot(x, [s["stalled_streams"] / s["requests"] for s in levels], "s-", label="stalled share")
b.axhline(0.3, ls="--", c="gray", lw=1)
b.set_yscale("symlog", linthresh=0.01)
b.text(322, 0.33, "TTFA bound 0.3 s", color="gray", fontsize=8)
b.set_xlabel("concurrent streams")
b.set_title("end to end, run C1 (7ef8ba7's tree)")
b.legend(fontsize=8)
fig.suptitle("Round 13 (random weights: speed only, not speech quality)", fontsize=10)
fig.tight_layout()
fig.savefig("docs/img/e2e_round13.png", dpi=110)
