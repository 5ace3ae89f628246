"""docs/img/e2e_round29.png from docs/data/e2e_round28.json and e2e_round29.json (needs
matplotlib): the decoder's call rate, the two states of a loaded server, and where the first
chunk's time went in round 29."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

r28 = json.load(open("docs/data/e2e_round28.json"))
r29 = json.load(open("docs/data/e2e_round29.json"))
levels = []  # (round, run, level dict)
for name, data in (("28", r28), ("29", r29)):
    for run, entry in data["runs"].items():
        levels += [(name, run, lv) for lv in entry["levels"]]
fig, (calls, states, split) = plt.subplots(1, 3, figsize=(16, 4.8))
for rnd, run, lv in levels:
    per_call = lv["decoder_frames_per_call"]
    rate = lv["decoder_frames_per_s"] / per_call
    healthy = lv["stalled_streams"] == 0
    relay = rnd == "28" and run.startswith("H")
    color = "tab:purple" if relay else ("tab:green" if healthy else "tab:red")
    marker = "o" if rnd == "28" else "s"
    calls.scatter(per_call, rate, color=color, marker=marker, s=30)
    if not relay:
        states.scatter(lv["decoder_frames_per_job"], lv["steps_per_s"], color=color,
                       marker=marker, s=30)
for fps in (15_000, 20_000, 25_000):
    xs = [140, 270]
    calls.plot(xs, [fps / x for x in xs], color="gray", lw=0.8, ls=":")
    calls.text(270, fps / 270, f"{fps:,} frames/s", fontsize=7, color="gray", va="center")
calls.set_ylim(0, 150)
calls.set_xlabel("new frames per decoder call")
calls.set_ylabel("decoder calls per second")
calls.set_title("~100 decoder calls/s at every level (core pipeline)")
states.set_xlabel("new frames per decoder job (chunk)")
states.set_ylabel("engine steps per second")
states.set_title("Two states: healthy (green) and collapsed (red)")
for ax in (calls, states):
    ax.scatter([], [], color="tab:green", label="no stream ran dry")
    ax.scatter([], [], color="tab:red", label="streams ran dry")
    ax.scatter([], [], color="tab:purple", label="relay (round 28)") if ax is calls else None
    ax.scatter([], [], color="k", marker="o", label="round 28")
    ax.scatter([], [], color="k", marker="s", label="round 29")
    ax.legend(fontsize=7, loc="lower right")
names, queue, gen, dec = [], [], [], []
for run, entry in r29["runs"].items():
    for lv in entry["levels"]:
        fc = lv["first_chunk"]
        names.append(f"{run}\n{lv['label']}")
        queue.append(fc["queue_s"])
        dec.append(fc["first_chunk_decode_s"])
        gen.append(max(fc["ttfa_s"] - fc["queue_s"] - fc["first_chunk_decode_s"], 0.0))
xs = range(len(names))
split.bar(xs, queue, color="tab:blue", label="arrival to first frame")
split.bar(xs, gen, bottom=queue, color="tab:orange", label="the first chunk's other frames")
split.bar(xs, dec, bottom=[q + g for q, g in zip(queue, gen)], color="tab:red",
          label="decoder queue and call")
split.set_xticks(list(xs), names, fontsize=7)
split.set_ylabel("mean seconds (server side)")
split.set_title("Round 29's time to first audio, split (all collapsed)")
split.legend(fontsize=7, loc="upper left")
fig.suptitle("Rounds 28-29 on the H200: random weights, speed only", fontsize=10)
fig.tight_layout()
fig.savefig("docs/img/e2e_round29.png", dpi=110)
