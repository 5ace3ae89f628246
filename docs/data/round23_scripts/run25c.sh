# Round 23, call 3: --boost-frames 32 again (576, 608), then 48 (576, 640), sync, engine-sms 56
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --first-chunk-deadline 0.17"
export PROCS=2 DUR=30 STOP_S=470
run_server B32b "$F --boost-frames 32" 576 608 > /tmp/b/B32b.txt 2>&1
run_server B48 "$F --boost-frames 48" 576 640 > /tmp/b/B48.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/B32b.txt /tmp/b/B48.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/B32b_* /tmp/b/B48_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz B32b B48 && rm -rf B32b B48
