# Round 30, call 2: a decoder call's fixed cost of 256 job-frames (--decoder-call-overhead 256,
# round 29's fit beside the engine) with 32 (E) and 16 (F) chunks per call at most, 960 and 1000.
source docs/data/round29_scripts/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS
grep -m1 "model name" /proc/cpuinfo | tee -a $LOG; nproc | tee -a $LOG
F="--early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --stream-pipeline core --first-chunk-deadline 0.15 --decoder-call-overhead 256"
export PROCS=2 DUR=30 STOP_S=300
run_server E "$F --max-decode-batch 32" 960 1000 2>&1 | tee -a $LOG
export STOP_S=500
run_server F "$F --max-decode-batch 16" 960 1000 2>&1 | tee -a $LOG
python3 docs/data/round29_scripts/split.py /tmp/b | tee -a $LOG  # first-chunk split, calls/s
cd $OUT && tar czf res.tgz E F 2>/dev/null; rm -rf E F; echo "total $((SECONDS-T0)) s" | tee -a $LOG
