"""Print each level's first-chunk split and decoder calls/s from every bench.json under the
given dirs (sorted by name): the fields round 14's summ.py line lacks."""
import glob
import json
import sys

for root in sys.argv[1:]:
    for path in sorted(glob.glob(f"{root}/**/bench.json", recursive=True)):
        for s in json.load(open(path))["levels"]:
            g = lambda k: s.get(k) or 0.0  # noqa: E731
            per_call = g("decoder_frames_per_call")
            calls = g("decoder_frames_per_s") / per_call if per_call else 0.0
            print(f"{path.split('/')[-2]:>14} L{s['level']:<5g} first frame {g('queue_s'):.3f} s, "
                  f"first chunk's decoder {g('first_chunk_decode_s'):.3f} s "
                  f"({g('first_chunk_frames'):.1f} frames), server TTFA {g('server_ttfa_s'):.3f} s, "
                  f"decoder {calls:.0f} calls/s")
