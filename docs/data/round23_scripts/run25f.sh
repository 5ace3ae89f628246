# Round 23, call 6: no boost at 608 and 640 on the same machine, sync, engine-sms 56
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --first-chunk-deadline 0.17"
export PROCS=2 DUR=30 STOP_S=150
run_server N1 "$F" 608 640 > /tmp/b/N1.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/N1.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/N1_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz N1 && rm -rf N1
