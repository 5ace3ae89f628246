# next session, call 1: asynchronous scheduling against main (sync), 30 s levels, PROCS=2
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=540
run_server A1 "$F --async-scheduling" 384 448 512 448 > /tmp/b/A1.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
grep -E "skip|died|up after" /tmp/b/A1.txt | tee -a $LOG
(cd $OUT && tar czf A1.tgz A1 && rm -rf A1)
