# call 3 (R2): GPU tests of branch wip/speculative-codes (f49e5b4), then R2 at 384/448/512 and 448 again
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
git log --oneline -1 | tee -a $LOG
timeout 230 python3 -m pytest -q -p no:warnings -rs --tb=short tests/engine/test_prefilter.py tests/engine/test_async_scheduling.py tests/engine/test_compiled_codes.py tests/engine/test_decode_step.py -k "cuda or gpu or captured" 2>&1 | grep -v "nanobind\| - leaked\|DEBUG" | tail -30 | tee -a $LOG
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=500
run_server R2 "$F" 384 448 512 448 > /tmp/b/R2.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
grep -E "skip|died|up after" /tmp/b/R2.txt | tee -a $LOG
grep -E "captured" /tmp/serve_R2.log | tee -a $LOG
(cd $OUT && tar czf R2.tgz R2 && rm -rf R2)
