# Round 24, call 6 (a new lease): GPU tests of the engine with the persistent batch (and boost
# steps sync/async), then async + boost 64 with the 0.15 s first-chunk deadline at 672 (the
# session's device time allowed one level).
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
timeout 150 python3 -m pytest -p no:cacheprovider --junitxml=$OUT/gpu_tests.xml \
  -k "cuda or gpu or graph or async or boost or persistent" tests/engine 2>&1 \
  | grep -E "passed|failed|^FAILED|^ERROR|^E " | tail -8 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling"
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 190))
run_server D15c "$F --first-chunk-deadline 0.15" 672 > /tmp/b/D15c.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/D15c.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/D15c_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz D15c && rm -rf D15c
