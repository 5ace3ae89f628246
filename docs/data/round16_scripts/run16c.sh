# call 2: the branch's failing CUDA test with its traceback, then main at 384/448
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
(cd .exp/wip && timeout 150 python3 -m pytest -x -p no:warnings --tb=long tests/engine/test_prefilter.py -k "captured_fallback or counts_the_draws" 2>&1 | grep -v "nanobind\| - leaked" | tail -80) | tee -a $LOG
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=480
run_server M1 "$F" 384 448 > /tmp/b/M1.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
grep -E "skip|died|up after" /tmp/b/M1.txt | tee -a $LOG
grep -E "captured" /tmp/serve_M1.log | tee -a $LOG
for t in M1; do [ -d $OUT/$t ] && (cd $OUT && tar czf $t.tgz $t && rm -rf $t); done
