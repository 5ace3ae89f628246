# Round 31, call 1 (as run): E (round 30's best flags) at 1000 as the lease's check, then
# R = E + --rebuffer-frames 24 at 1000, then R + --first-chunk-frames 8 (early-chunk floor 4
# frames instead of 5: TTFA's first chunk waits one step less) at 1000 and 1024.
# .exp (carried) holds round 14's summ.py and round 11's cpu_snap.py and cpu_diff.py.
source docs/data/round29_scripts/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS
grep -m1 "model name" /proc/cpuinfo | tee -a $LOG; nproc | tee -a $LOG
F="--early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --stream-pipeline core --first-chunk-deadline 0.15 --max-decode-batch 32 --decoder-call-overhead 256"
export PROCS=2 DUR=30 STOP_S=290
run_server E "$F" 1000 2>&1 | tee -a $LOG
export STOP_S=390
run_server R "$F --rebuffer-frames 24" 1000 2>&1 | tee -a $LOG
export STOP_S=470
run_server R8 "$F --rebuffer-frames 24 --first-chunk-frames 8" 1000 1024 2>&1 | tee -a $LOG
python3 docs/data/round29_scripts/split.py /tmp/b | tee -a $LOG  # first-chunk split, calls/s
cd $OUT && tar czf res.tgz E R R8 2>/dev/null; rm -rf E R R8; echo "total $((SECONDS-T0)) s" | tee -a $LOG
