# Round 23, call 1: boost steps for young streams (--boost-frames 32), sync, engine-sms 56
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --first-chunk-deadline 0.17"
export PROCS=2 DUR=30 STOP_S=500
run_server B32 "$F --boost-frames 32" 512 576 640 > /tmp/b/B32.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/B32.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/B32_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz B32 && rm -rf B32
