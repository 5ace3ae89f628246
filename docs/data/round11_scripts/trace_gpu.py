"""trace_gpu.py TRACE.json: per-stream kernel time, union busy, over the trace window"""

import collections
import json
import sys

tr = json.load(open(sys.argv[1]))
ev = [
    e
    for e in tr["traceEvents"]
    if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
]


def union(iv):
    iv = sorted(iv)
    tot = 0
    s, e = None, None
    for a, b in iv:
        if s is None or a > e:
            if s is not None:
                tot += e - s
            s, e = a, b
        else:
            e = max(e, b)
    return tot + (e - s if s is not None else 0)


t0 = min(e["ts"] for e in ev)
t1 = max(e["ts"] + e["dur"] for e in ev)
win = t1 - t0
print(
    f"window {win / 1e3:.1f} ms, {len(ev)} device events, union busy {union([(e['ts'], e['ts'] + e['dur']) for e in ev]) / win:.3f}"
)
by = collections.defaultdict(list)
for e in ev:
    by[e["args"].get("stream", e.get("tid"))].append(e)
for s, es in sorted(by.items(), key=lambda kv: -len(kv[1])):
    iv = [(e["ts"], e["ts"] + e["dur"]) for e in es]
    print(
        f"stream {s}: {len(es)} events, sum {sum(e['dur'] for e in es) / win:.3f}, union {union(iv) / win:.3f} of window"
    )
    top = collections.Counter()
    for e in es:
        top[e["name"][:60]] += e["dur"]
    for n, d in top.most_common(6):
        print(f"     {d / win:.3f} {n}")
