# Round 22, call 3 (same machine as call 2, warm): the deadline of record (0.17 s) with 56
# reserved SMs as this machine's control (G6) at 448/480, then a third run of H1 at 480/512.
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=470
run_server G6 "--engine-sms 56 --first-chunk-deadline 0.17 $F" 448 480 > /tmp/b/G6.txt 2>&1
run_server H1c "--engine-sms 56 --first-chunk-deadline 0.15 $F" 480 512 > /tmp/b/H1c.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/G6.txt /tmp/b/H1c.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/G6_* /tmp/b/H1c_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz G6 H1c && rm -rf G6 H1c
