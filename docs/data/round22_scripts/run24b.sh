# Round 22, call 2: a second run of H1 (56 SMs reserved for the engine, first-chunk deadline
# 0.15 s) at 448/480 streams, then the deadline lowered to 0.13 s (H3).
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=490
run_server H1b "--engine-sms 56 --first-chunk-deadline 0.15 $F" 448 480 > /tmp/b/H1b.txt 2>&1
run_server H3 "--engine-sms 56 --first-chunk-deadline 0.13 $F" 448 480 > /tmp/b/H3.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/H1b.txt /tmp/b/H3.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz H1b H3 && rm -rf H1b H3
