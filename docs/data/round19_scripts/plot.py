"""docs/img/decoder_round19.png: SiLU on load vs in the producing conv's epilogue (H200, bf16)."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# silu_ab.py (one conv, 16 chunks x 24 frames, us): (channels, taps) -> (SiLU on load, none)
CONV = {
    "16 ch, K=11": (120.3, 47.2), "16 ch, K=3": (41.4, 30.6),
    "32 ch, K=11": (124.5, 48.4), "32 ch, K=3": (42.6, 26.2),
    "64 ch, K=11": (120.8, 52.1), "64 ch, K=3": (47.0, 28.5),
    "128 ch, K=11": (151.8, 73.7), "128 ch, K=3": (59.6, 59.2),
    "256 ch, K=11": (70.0, 60.0), "256 ch, K=3": (53.4, 52.8),
}
head = json.load(open("docs/data/e2e_round19.json"))["head_ms_per_call"]
fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
names = list(CONV)
x = range(len(names))
a.bar([i - 0.2 for i in x], [CONV[n][0] for n in names], 0.4, label="SiLU on load (per tap)")
a.bar([i + 0.2 for i in x], [CONV[n][1] for n in names], 0.4, label="input already SiLU'd")
a.set_xticks(list(x), names, rotation=45, ha="right")
a.set_ylabel("us per conv")
a.set_title("One head convolution (16 chunks x 24 frames)")
a.legend()
calls = list(head)
frames = [int(c.split("x")[0]) * int(c.split("x")[1]) for c in calls]
y = range(len(calls))
b.bar([i - 0.2 for i in y], [f / head[c][0] * 1e3 for c, f in zip(calls, frames)], 0.4,
      label="before (b61ffc0)")
b.bar([i + 0.2 for i in y], [f / head[c][1] * 1e3 for c, f in zip(calls, frames)], 0.4,
      label="SiLU in the epilogue")
b.set_xticks(list(y), calls)
b.set_xlabel("call: chunks x new frames each (+15 context frames)")
b.set_ylabel("new frames per second")
b.set_title("Trimmed Triton head, released size, bf16 (random weights)")
b.legend()
fig.tight_layout()
fig.savefig("docs/img/decoder_round19.png", dpi=110)
