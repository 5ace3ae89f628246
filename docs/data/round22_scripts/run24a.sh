# Round 22, call 1: the GPU tests of the SM partitions (after round 21's last edits), counted
# from a JUnit report; then sync with 56 SMs reserved for the engine and a first-chunk deadline
# of 0.15 s (H1) at 448/480 streams, and 64 reserved SMs with the deadline of record (H2).
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/engine/test_sm_partition.py -rs \
  --junitxml=$OUT/junit.xml > /tmp/b/pytest.txt 2>&1; echo "pytest rc=$? after $SECONDS s" | tee -a $LOG
grep -oE 'tests="[0-9]+"|failures="[0-9]+"|errors="[0-9]+"|skipped="[0-9]+"' $OUT/junit.xml | head -4 | tee -a $LOG
grep -E "^E |FAILED|SKIPPED" /tmp/b/pytest.txt | head -20 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=490
run_server H1 "--engine-sms 56 --first-chunk-deadline 0.15 $F" 448 480 > /tmp/b/H1.txt 2>&1
run_server H2 "--engine-sms 64 --first-chunk-deadline 0.17 $F" 448 480 > /tmp/b/H2.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/H1.txt /tmp/b/H2.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz H1 H2 && rm -rf H1 H2
