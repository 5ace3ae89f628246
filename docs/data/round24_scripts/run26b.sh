# Round 24, call 2: GPU tests of boost steps (sync and async), then sync + boost 64 (same lease).
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -k "cuda or gpu or graph" tests/engine/test_boost_steps.py \
  tests/engine/test_async_scheduling.py 2>&1 | grep -vi "leak\|nanobind" | tail -15 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --first-chunk-deadline 0.17"
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 300))
run_server B64 "$F --boost-frames 64" 640 704 > /tmp/b/B64.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/B64.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/B64_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz B64 && rm -rf B64
