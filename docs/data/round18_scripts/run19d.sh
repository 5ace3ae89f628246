# call 3: pacing (lead 2 s), sync then async
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=540
run_server P1 "$F --pace-lead 2" 448 576 704 > /tmp/b/P1.txt 2>&1
run_server P2 "$F --pace-lead 2 --async-scheduling" 576 704 832 > /tmp/b/P2.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
grep -E "skip|died|up after" /tmp/b/P1.txt /tmp/b/P2.txt | tee -a $LOG
grep -h -A3 "paced" $OUT/P1/health_end.json | head -3 >> $LOG
(cd $OUT && tar czf P.tgz P1 P2 && rm -rf P1 P2)
