# call 1 (R1): GPU tests of main's CPU-tested changes, then main (d9b76db) at 384/448/512, 30 s levels
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
timeout 200 python3 -m pytest -q -p no:warnings -rs --tb=short tests/engine/test_busy_timer.py tests/engine/test_staging.py tests/engine/test_prefilter.py tests/engine/test_decode_step.py tests/audio/test_decoder_runner.py -k "cuda or gpu or graph or staging or staged or busy or fallback" 2>&1 | grep -v "nanobind\| - leaked\|DEBUG" | tail -25 | tee -a $LOG
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=560
run_server R1 "$F" 384 448 512 > /tmp/b/R1.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
grep -E "skip|died|up after" /tmp/b/R1.txt | tee -a $LOG
grep -E "captured" /tmp/serve_R1.log | tee -a $LOG
for t in R1; do [ -d $OUT/$t ] && (cd $OUT && tar czf $t.tgz $t && rm -rf $t); done
