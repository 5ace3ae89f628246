"""docs/img/e2e_round14.png from docs/data/e2e_round14.json (run from the repository root)."""
import json
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

d = json.load(open("docs/data/e2e_round14.json"))
fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.2))

rows = d["bench_decoder"]["results"] if isinstance(d["bench_decoder"], dict) else d["bench_decoder"]
for mode, style in (("triton", "o-"), ("triton-pipelined", "s-")):
    pts = [r for r in rows if r["mode"] == mode]
    a.plot([r["batch"] for r in pts], [r["frames_per_s"] for r in pts], style, label=mode)
a.set_xlabel("chunks per decoder call (10 and 40 new frames in turn)")
a.set_ylabel("new frames/s (decoder alone)")
a.set_title("bench-decoder, bf16, same lease")
a.legend(fontsize=8)


def levels(run):
    out = []
    for name, v in d["runs"][run].items():
        if name.endswith(".json"):
            out += v["levels"]
    for line in d["runs"][run].get("printed", []):
        m = re.search(r"L(\d+) .*ttfa=[\d.]+/[\d.]+/([\d.]+).*stalled=(\d+)", line)
        n = int(re.search(r"n=(\d+)", line).group(1))
        out.append({"level": int(m.group(1)), "ttfa_s": {"p99": float(m.group(2))},
                    "stalled_streams": int(m.group(3)), "requests": n})
    return out


for run, style, color in (("P1", "o", "tab:blue"), ("P2", "o", "tab:blue"), ("P3", "o", "tab:blue"),
                          ("P4", "o", "tab:blue"), ("S1", "x", "tab:red"), ("S2", "x", "tab:red")):
    for s in levels(run):
        b.scatter(s["level"], s["stalled_streams"] / s["requests"], marker=style, color=color,
                  label=("pipelined" if color == "tab:blue" else "not pipelined"))
h, l = b.get_legend_handles_labels()
b.legend(dict(zip(l, h)).values(), dict(zip(l, h)).keys(), fontsize=8)
b.set_xlabel("concurrent streams (old load generator)")
b.set_ylabel("share of streams that stalled")
b.set_title("end to end: stalled streams per level")

r = d["runs"]["P4"]["requests_384"]
c.scatter([x[0] for x in r], [x[2] for x in r], s=6, label="TTFA (client)")
c.scatter([x[0] for x in r], [x[1] for x in r], s=6, label="time to send the request (client)")
c.set_yscale("symlog", linthresh=0.1)
c.set_xlabel("request start (s into the run)")
c.set_ylabel("seconds")
c.set_title("run P4, 384 streams: the load generator's wait")
c.legend(fontsize=8)
fig.suptitle("Round 14 (random weights: speed only, not speech quality)", fontsize=10)
fig.tight_layout()
fig.savefig("docs/img/e2e_round14.png", dpi=110)
