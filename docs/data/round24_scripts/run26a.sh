# Round 24, call 1: GPU tests of boost steps (sync and async; this try printed nothing: with -q here
# and in pyproject's addopts pytest prints no count line for the grep, so call 2 ran them again and
# printed its dots), then async + boost 64 end to end.
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
timeout 150 python3 -m pytest -q -p no:cacheprovider -k "cuda or gpu or graph" tests/engine/test_boost_steps.py \
  tests/engine/test_async_scheduling.py 2>&1 | grep -E "passed|failed|^FAILED|^E " | head -20 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --first-chunk-deadline 0.17"
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 330))
run_server A64 "$F --boost-frames 64 --async-scheduling" 640 704 768 > /tmp/b/A64.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/A64.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/A64_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz A64 && rm -rf A64
