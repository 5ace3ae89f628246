# Round 30, call 3: the GPU tests, then E (round 30's best: 32 chunks per call, fixed cost 256
# job-frames) again at 1000 and at 1024.
source docs/data/round29_scripts/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS
python3 -m pytest -p no:cacheprovider -q -k "cuda or gpu or graph or triton or prefilter or static_rows or warm or probe" tests/engine tests/bench/test_device_probe.py tests/server/test_engine_process.py tests/server/test_relay.py 2>&1 | tail -3 | tee -a $LOG
echo "tests $((SECONDS-T0)) s" | tee -a $LOG
F="--early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --stream-pipeline core --first-chunk-deadline 0.15 --decoder-call-overhead 256"
export PROCS=2 DUR=30 STOP_S=480
run_server E "$F --max-decode-batch 32" 1000 1024 2>&1 | tee -a $LOG
python3 docs/data/round29_scripts/split.py /tmp/b | tee -a $LOG  # first-chunk split, calls/s
cd $OUT && tar czf res.tgz E 2>/dev/null; rm -rf E; echo "total $((SECONDS-T0)) s" | tee -a $LOG
