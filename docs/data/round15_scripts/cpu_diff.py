"""cpu_diff.py A.json B.json: per-thread CPU share between two snapshots"""
import json, os, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
wall = b["t"] - a["t"]; hz = os.sysconf("SC_CLK_TCK")
for pid, pb in b["procs"].items():
    pa = a["procs"].get(pid, {"tasks": {}})
    rows = []
    for tid, (comm, ticks) in pb["tasks"].items():
        d = ticks - pa["tasks"].get(tid, [comm, 0])[1]
        if d:
            rows.append((d / hz / wall, comm, tid))
    if not rows:
        continue
    tot = sum(r[0] for r in rows)
    print(f"pid {pid} total {tot:.2f} cores over {wall:.1f}s: {pb['cmd'][:60]}")
    for share, comm, tid in sorted(rows, reverse=True)[:8]:
        print(f"   {share:5.2f}  {comm:16s} {tid}")
