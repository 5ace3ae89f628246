# call 2: main (sync) then async again, same machine, for the A/B
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=560
run_server S1 "$F" 384 448 512 448 > /tmp/b/S1.txt 2>&1
run_server A2 "$F --async-scheduling" 384 448 512 448 > /tmp/b/A2.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
grep -E "skip|died|up after" /tmp/b/S1.txt /tmp/b/A2.txt | tee -a $LOG
(cd $OUT && tar czf S1A2.tgz S1 A2 && rm -rf S1 A2)
