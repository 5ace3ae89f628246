# call 5: async again at 384 and 352 (warm machine)
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=150
run_server A4 "$F --async-scheduling" 384 352 > /tmp/b/A4.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
grep -E "skip|died|up after" /tmp/b/A4.txt | tee -a $LOG
(cd $OUT && tar czf A4.tgz A4 && rm -rf A4)
