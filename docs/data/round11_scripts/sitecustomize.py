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
