# Round 21, call 3: the engine's graphs now captured on its partition's stream (so they run on
# its SMs only); GPU tests of the partitions, then sync, engine on 56 SMs, at 448/480/512
# streams, and a second run at 448/512 as time allows.
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG; git status --short | tee -a $LOG
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/engine/test_sm_partition.py -rs \
  2>&1 | grep -E "passed|failed|SKIPPED|Error|^E " | head -20 | tee -a $LOG
F="--max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 440))
run_server G4 "--engine-sms 56 $F" 448 480 512 > /tmp/b/G4.txt 2>&1
run_server G5 "--engine-sms 56 $F" 448 512 > /tmp/b/G5.txt 2>&1
grep -hE "skip|died|up after|SMs" /tmp/b/G4.txt /tmp/b/G5.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz G4 G5 && rm -rf G4 G5
