"""probe_summ.py DIR [PREVDIR]: GIL overshoot and top stacks per thread of each process (diff vs PREVDIR)"""
import glob, json, os, sys
from collections import Counter
def load(d):
    out = {}
    for p in glob.glob(f"{d}/probe_*.json"):
        out[os.path.basename(p)] = json.load(open(p))
    return out
cur = load(sys.argv[1]); prev = load(sys.argv[2]) if len(sys.argv) > 2 else {}
for name, d in cur.items():
    argv = " ".join(d["argv"])[:80]
    print(f"== {name} {argv}\n   gil overshoot ms {d['gil_over_ms']} mean {d['gil_over_mean_ms']:.3f}")
    pv = prev.get(name, {"stacks": {}})
    for th, st in d["stacks"].items():
        c = Counter(dict((k, v) for k, v in st)) - Counter(dict((k, v) for k, v in pv["stacks"].get(th, [])))
        tot = d["samples"][th] - (pv.get("samples", {}).get(th, 0))
        if tot < 20:
            continue
        print(f"   -- {th} samples {tot}")
        for k, v in c.most_common(8):
            print(f"      {v / max(tot, 1):5.2f}  {k[:230]}")
