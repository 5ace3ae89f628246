# Round 23, call 5: no boost (576) on the same machine, --boost-frames 64 (576, 608), sync, engine-sms 56
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --first-chunk-deadline 0.17"
export PROCS=2 DUR=30 STOP_S=300
run_server N0 "$F" 576 > /tmp/b/N0.txt 2>&1
run_server B64b "$F --boost-frames 64" 576 608 > /tmp/b/B64b.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/N0.txt /tmp/b/B64b.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/N0_* /tmp/b/B64b_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz N0 B64b && rm -rf N0 B64b
