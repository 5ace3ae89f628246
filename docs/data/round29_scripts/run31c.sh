# Round 29, device call 3 (cold): first chunk 8 frames / 0.12 s (B3) at 1000, 1024, 1000 with the first-chunk breakdown; then the GPU tests
source docs/data/round29_scripts/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --stream-pipeline core"
export PROCS=2 DUR=30 STOP_S=360
python3 -m fishserve probe 2>&1 | tail -2 | tee -a $LOG
run_server B3 "$F --first-chunk-frames 8 --first-chunk-deadline 0.12" 1000 1024 1000 2>&1 | tee -a $LOG
(( SECONDS - T0 < 470 )) && timeout $((590 - SECONDS + T0)) python3 -m pytest -p no:cacheprovider -k "cuda or gpu or graph or triton or prefilter or static_rows or warm or probe" tests/engine tests/bench/test_device_probe.py tests/server/test_engine_process.py tests/server/test_relay.py 2>&1 | grep -E "passed|failed|FAILED|ERROR" | tail -8 | tee -a $LOG
cd $OUT && tar czf res.tgz B3 2>/dev/null; rm -rf B3; echo "total $((SECONDS-T0)) s" | tee -a $LOG
