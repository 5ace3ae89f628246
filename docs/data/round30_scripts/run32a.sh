# Round 30, call 1: the lease's CPU, round 28's flags (A) at 896 as the lease's check, then
# larger decoder calls (D: --max-decode-batch 32) at 896, 960 and 1000 (round 29's next_round.sh).
# .exp (carried) holds round 14's summ.py and round 11's cpu_snap.py and cpu_diff.py.
source docs/data/round29_scripts/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS
grep -m1 "model name" /proc/cpuinfo | tee -a $LOG; nproc | tee -a $LOG; git log -1 --format=%h | tee -a $LOG
F="--early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --stream-pipeline core --first-chunk-deadline 0.15"
export PROCS=2 DUR=30 STOP_S=290
run_server A "$F --max-decode-batch 16" 896 2>&1 | tee -a $LOG
export STOP_S=520
run_server D "$F --max-decode-batch 32" 896 960 1000 2>&1 | tee -a $LOG
python3 docs/data/round29_scripts/split.py /tmp/b | tee -a $LOG  # first-chunk split, calls/s
cd $OUT && tar czf res.tgz A D 2>/dev/null; rm -rf A D; echo "total $((SECONDS-T0)) s" | tee -a $LOG
