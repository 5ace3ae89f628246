# Round 24, call 3: async + boost 64 again at 672 and 704 (same lease), and with 64 engine SMs at 704.
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
F="--max-decode-batch 16 --early-chunk-margin 0.12 --first-chunk-deadline 0.17 --boost-frames 64 --async-scheduling"
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 330))
run_server A64b "$F --engine-sms 56" 672 704 > /tmp/b/A64b.txt 2>&1
run_server E64 "$F --engine-sms 64" 704 > /tmp/b/E64.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/A64b.txt /tmp/b/E64.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/A64b_* /tmp/b/E64_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz A64b E64 && rm -rf A64b E64
