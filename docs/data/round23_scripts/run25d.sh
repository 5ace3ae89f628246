# Round 23, call 4: --boost-frames 64 (640, 704), 48 again (640), sync, engine-sms 56
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --first-chunk-deadline 0.17"
export PROCS=2 DUR=30 STOP_S=470
run_server B64 "$F --boost-frames 64" 640 704 > /tmp/b/B64.txt 2>&1
run_server B48b "$F --boost-frames 48" 640 > /tmp/b/B48b.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/B64.txt /tmp/b/B48b.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/B64_* /tmp/b/B48b_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz B64 B48b && rm -rf B64 B48b
