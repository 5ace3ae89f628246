"""Event-loop lag of the load generator at 384 streams against fake_server.py on port 18555
(uvicorn fake_server:app --port 18555): prints the loop lags over 0.2 s and the requests
sent more than 0.5 s late; bench.json goes to /tmp/fake/out4."""
import asyncio, collections, time
from pathlib import Path
from rich.console import Console
import fishserve.bench.run as R
from fishserve.bench.run import BenchOptions, run_bench
from fishserve.bench.workload import RequestShape, builtin_workload
LAG = []
orig = R.bench
async def patched(opts, progress):
    async def watch():
        t0 = time.perf_counter()
        while True:
            a = time.perf_counter(); await asyncio.sleep(0.01); lag = time.perf_counter() - a - 0.01
            if lag > 0.2: LAG.append((round(a - t0, 2), round(lag, 2)))
    w = asyncio.create_task(watch())
    try:
        return await orig(opts, progress)
    finally:
        w.cancel()
R.bench = patched
opts = BenchOptions(url="http://127.0.0.1:18555", workload=builtin_workload(("short",), ("en",)),
    shape=RequestShape(max_new_tokens=216, ignore_eos=True), levels=[384], duration_s=15.0, ramp_s=8.0,
    warmup=1, timeout_s=40.0, output_dir=Path("/tmp/fake/out4"))
rep = run_bench(opts, Console(stderr=True))
print("loop lags > 0.2 s:", LAG[:20])
late = [r for r in rep.requests if (r.sent_s or 0) > 0.5]
print("late", len(late), sorted(set(round(r.start_s, 1) for r in late))[:10])
