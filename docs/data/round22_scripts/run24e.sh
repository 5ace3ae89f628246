# Round 22, call 5 (same machine, warm): a second run of the deadline of record (G8) at 480
# and 512 streams.
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=200
run_server G8 "--engine-sms 56 --first-chunk-deadline 0.17 $F" 480 512 > /tmp/b/G8.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/G8.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/G8_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz G8 && rm -rf G8
