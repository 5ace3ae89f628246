# Round 22, call 4 (same machine, warm): the deadline of record with 56 reserved SMs (G7) at
# 512-640 streams, where this machine's capacity edge lies.
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=330
run_server G7 "--engine-sms 56 --first-chunk-deadline 0.17 $F" 512 544 576 640 > /tmp/b/G7.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/G7.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/G7_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz G7 && rm -rf G7
