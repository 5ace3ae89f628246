"""docs/img/e2e_round31.png from docs/data/e2e_round31.json (needs matplotlib): each run at
1,000 streams (TTFA p99 and the share of requests with a gap, by lease), engine steps/s
against the start-up host probe, and the time course of real-time admission (call 3, run I)."""
import json

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

data = json.load(open("docs/data/e2e_round31.json"))
COLOR = {1: "tab:blue", 2: "tab:orange", 3: "tab:purple", 4: "tab:green"}
fig, (runs, host, course) = plt.subplots(1, 3, figsize=(17, 4.8))
names, p99, gap, colors, probes, steps = [], [], [], [], [], []
for key, run in data["runs"].items():
    for lv in run["levels"]:
        name = f"{key.split(':')[1]}{run['lease']}@{lv['label']}"
        names.append(name)
        p99.append(lv["ttfa_s"]["p99"])
        gap.append(lv["stalled_streams"] / lv["requests"])
        colors.append(COLOR[run["lease"]])
        probes.append(run["health_start"]["host_probe_ms"])
        steps.append(lv["steps_per_s"])
x = np.arange(len(names))
runs.bar(x - 0.2, p99, 0.4, color=colors, label="TTFA p99 (s)")
runs.bar(x + 0.2, gap, 0.4, color=colors, alpha=0.35, hatch="//",
         label="share of requests with a gap")
runs.axhline(0.3, color="gray", ls="--", lw=1)
runs.set_xticks(x, names, rotation=45, ha="right", fontsize=8)
runs.set(title="Each level (color: lease; dashed: 0.3 s)", ylim=(0, 3.2))
runs.legend(fontsize=8)
host.scatter(probes, steps, c=colors, s=70)
for px, sy, n in zip(probes, steps, names, strict=True):
    host.annotate(n, (px, sy), fontsize=7, xytext=(4, 2), textcoords="offset points")
host.axhline(1000 * 21.53 / 420, color="gray", ls=":", lw=1)
host.set(xlabel="host probe at server start (ms, higher is a slower host)",
         ylabel="engine steps per second", title="Steps/s by lease (dotted: real time at "
         "1,000 streams, 420 frames/step)")
rows = np.array(data["calls"]["c3"]["metrics_1s"], dtype=float)
t, running, waiting, frames = rows[:, 0] - rows[0, 0], rows[:, 1], rows[:, 2], rows[:, 3]
fps = np.gradient(frames, rows[:, 0])
course.plot(t, running, label="running")
course.plot(t, waiting, label="waiting (held)")
course.plot(t, fps / 30, label="engine frames/s / 30")
course.set(xlabel="s since server start (two levels: 1,000 then 960 streams)",
           title="Call 3, run I: real-time admission 1.15 (1 s samples)")
course.legend(fontsize=8)
fig.text(0.5, 0.005, "Random weights: speed only, not speech quality. Data: "
         "docs/data/e2e_round31.json", ha="center", fontsize=8)
fig.tight_layout(rect=(0, 0.03, 1, 1))
fig.savefig("docs/img/e2e_round31.png", dpi=110)
