# Round 24, call 4: async + boost 64 at 640 again; first-chunk deadline 0.15 at 672.
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling"
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 240))
run_server A64c "$F --first-chunk-deadline 0.17" 640 > /tmp/b/A64c.txt 2>&1
run_server D15 "$F --first-chunk-deadline 0.15" 672 > /tmp/b/D15.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/A64c.txt /tmp/b/D15.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/A64c_* /tmp/b/D15_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz A64c D15 && rm -rf A64c D15
