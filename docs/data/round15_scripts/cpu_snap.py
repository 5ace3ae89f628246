"""snapshot per-thread CPU ticks of fishserve processes: cpu_snap.py OUT.json"""
import json, os, sys, time
snap = {"t": time.monotonic(), "procs": {}}
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        continue
    if "fishserve" not in cmd and "multiprocessing" not in cmd:
        continue
    tasks = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            st = open(f"/proc/{pid}/task/{tid}/stat").read()
        except OSError:
            continue
        f = st[st.rfind(")") + 2:].split()
        tasks[tid] = [comm, int(f[11]) + int(f[12])]
    snap["procs"][pid] = {"cmd": cmd[:80], "tasks": tasks}
json.dump(snap, open(sys.argv[1], "w"))
