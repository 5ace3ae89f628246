# Round 24, call 5: async + boost 64, first-chunk deadline 0.15 at 704 and 736.
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling"
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 240))

run_server D15b "$F --first-chunk-deadline 0.15" 704 736 > /tmp/b/D15b.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/D15b.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/D15b_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz D15b && rm -rf D15b
