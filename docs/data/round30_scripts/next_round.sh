# Planned first device call of the next round (not run yet): E's flags (round 30's best) at
# 1000 as the lease's check, then the same with --rebuffer-frames 24 (R) at 1000 and 1024.
# Round 30's lead: a collapsed server sends 10-16 frames per chunk against 25 when healthy
# (§6.30); rebuffer_frames keeps stalled streams' chunks long.
# .exp (carried) holds round 14's summ.py and round 11's cpu_snap.py and cpu_diff.py.
source docs/data/round29_scripts/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS
grep -m1 "model name" /proc/cpuinfo | tee -a $LOG; nproc | tee -a $LOG
F="--early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --stream-pipeline core --first-chunk-deadline 0.15 --max-decode-batch 32 --decoder-call-overhead 256"
export PROCS=2 DUR=30 STOP_S=290
run_server E "$F" 1000 2>&1 | tee -a $LOG
export STOP_S=500
run_server R "$F --rebuffer-frames 24" 1000 1024 2>&1 | tee -a $LOG
python3 docs/data/round29_scripts/split.py /tmp/b | tee -a $LOG  # first-chunk split, calls/s
cd $OUT && tar czf res.tgz E R 2>/dev/null; rm -rf E R; echo "total $((SECONDS-T0)) s" | tee -a $LOG
