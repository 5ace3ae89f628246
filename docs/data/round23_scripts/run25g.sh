# Round 23, call 7 (a new lease): --boost-frames 64 at 640 again, sync, engine-sms 56
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --first-chunk-deadline 0.17"
export PROCS=2 DUR=30 STOP_S=200
run_server B64c "$F --boost-frames 64" 640 > /tmp/b/B64c.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/B64c.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/B64c_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz B64c && rm -rf B64c
