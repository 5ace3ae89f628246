"""Print one line per level of every bench.json under the given dirs (sorted by name): round 14's, with the first-chunk split and decoder calls/s."""
import glob, json, sys
for root in sys.argv[1:]:
    for path in sorted(glob.glob(f"{root}/**/bench.json", recursive=True)):
        for s in json.load(open(path))["levels"]:
            t = s["ttfa_s"]; g = lambda k: s.get(k) or 0.0
            print(f"{path.split('/')[-2]:>14} L{s['level']:<5g} n={s['requests']:<4} ok={s['ok']:<4} "
                  f"err={s['errors'] or 0} inflight={g('mean_in_flight'):.0f} "
                  f"ttfa={t['p50']:.3f}/{t['p90']:.3f}/{t['p99']:.3f} rtf90={s['rtf']['p90']:.2f} "
                  f"max={s['rtf_max']:.2f} stalled={s['stalled_streams']} fps={s['frames_per_s']:.0f} "
                  f"steps={g('steps_per_s'):.1f}/{g('frames_per_step'):.0f} busy={g('llm_busy'):.2f}/"
                  f"{g('decoder_busy'):.2f} f/call={g('decoder_frames_per_call'):.0f} "
                  f"f/job={g('decoder_frames_per_job'):.1f} boost={g('boost_share'):.2f} sent99={((s.get('sent_s') or {}).get('p99') or 0):.3f} "
                  f"probe={g('host_probe_ms'):.1f}/{g('host_probe_after_ms'):.1f} cpu={g('cpu_busy'):.2f} steal={g('cpu_steal'):.3f} gil={g('gil_wait_ms'):.2f} "
                  f"split={g('queue_s'):.3f}/{g('first_chunk_decode_s'):.3f}({g('first_chunk_frames'):.1f}) "
                  f"calls/s={(g('decoder_frames_per_s') / g('decoder_frames_per_call') if g('decoder_frames_per_call') else 0):.0f}")
