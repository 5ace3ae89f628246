# Round 21, call 2: GPU tests of the SM partitions (summary lines), then sync with the engine on
# 56 SMs of its own at 448/480/512 streams (second run), then on 48 SMs at 448/512.
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/engine/test_sm_partition.py -rs -x \
  2>&1 | grep -E "passed|failed|SKIPPED|Error|assert|^E " | head -20 | tee -a $LOG
F="--max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 470))
run_server G2 "--engine-sms 56 $F" 448 480 512 > /tmp/b/G2.txt 2>&1
run_server G3 "--engine-sms 48 $F" 448 512 > /tmp/b/G3.txt 2>&1
grep -hE "skip|died|up after|SMs" /tmp/b/G2.txt /tmp/b/G3.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz G2 G3 && rm -rf G2 G3
