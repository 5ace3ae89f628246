# experiment only: give each Python thread its OS name (top -H, /proc/*/task/*/comm)
import ctypes, threading
try:
    _libc = ctypes.CDLL(None)
    _orig = threading.Thread.run
    def _run(self):
        try:
            _libc.prctl(15, self.name[:15].encode(), 0, 0, 0)
        except Exception:
            pass
        _orig(self)
    threading.Thread.run = _run
except Exception:
    pass

# experiment only (FS_PROBE=1): GIL-wait probe + wall-clock stack sampler, dumped to /tmp/b
import os as _os, sys as _sys
if _os.environ.get("FS_PROBE") and "bench" not in " ".join(_sys.argv):
    import collections as _c, json as _j, time as _t

    import gc as _gc
    _gcst = {"n": [0, 0, 0], "ms": [0.0, 0.0, 0.0], "max": [0.0, 0.0, 0.0], "t0": 0.0}

    def _gccb(phase, info):
        if phase == "start":
            _gcst["t0"] = _t.perf_counter()
            return
        g = info.get("generation", 0)
        d = (_t.perf_counter() - _gcst["t0"]) * 1e3
        _gcst["n"][g] += 1
        _gcst["ms"][g] += d
        _gcst["max"][g] = max(_gcst["max"][g], d)

    _gc.callbacks.append(_gccb)

    def _census():
        objs = _gc.get_objects(2)
        top = _c.Counter(type(o).__qualname__ for o in objs).most_common(20)
        return {"sizes": [len(_gc.get_objects(g)) for g in (0, 1)] + [len(objs)],
                "frozen": _gc.get_freeze_count(), "top2": top}

    def _probe():
        over = []
        stacks = _c.defaultdict(_c.Counter)
        n = 0
        last_dump = _t.monotonic()
        while True:
            t0 = _t.perf_counter()
            _t.sleep(0.002)
            over.append(_t.perf_counter() - t0 - 0.002)
            n += 1
            if n % 5 == 0:  # every ~10 ms: sample every thread's stack
                names = {t.ident: t.name for t in threading.enumerate()}
                for ident, frame in _sys._current_frames().items():
                    if ident == threading.get_ident():
                        continue
                    keys = []
                    f = frame
                    while f is not None and len(keys) < 6:
                        co = f.f_code
                        keys.append(f"{_os.path.basename(co.co_filename)}:{co.co_name}:{f.f_lineno}")
                        f = f.f_back
                    stacks[names.get(ident, str(ident))][" < ".join(keys)] += 1
            now = _t.monotonic()
            if now - last_dump > 10:
                last_dump = now
                o = sorted(over[-5000:])
                q = lambda p: o[min(len(o) - 1, int(p * len(o)))]
                out = {"argv": _sys.argv, "t": now, "gil_over_ms": {k: q(p) * 1e3 for k, p in
                       (("p50", .5), ("p90", .9), ("p99", .99), ("max", 1.0))},
                       "gil_over_mean_ms": sum(o) / len(o) * 1e3,
                       "stacks": {k: v.most_common(25) for k, v in stacks.items()},
                       "samples": {k: sum(v.values()) for k, v in stacks.items()},
                       "gc": dict(_gcst), "census": _census()}
                try:
                    _os.makedirs("/tmp/b", exist_ok=True)
                    with open(f"/tmp/b/probe_{_os.getpid()}.json", "w") as fh:
                        _j.dump(out, fh)
                except Exception:
                    pass

    def _start_probe():
        threading.Thread(target=_probe, name="fs-probe", daemon=True).start()

    _start_probe()
