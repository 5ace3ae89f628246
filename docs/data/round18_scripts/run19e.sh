# call 4: async again at 384, then 352 (the RTF <= 0.5 criterion)
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=245
run_server A3 "$F --async-scheduling" 384 352 320 > /tmp/b/A3.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
grep -E "skip|died|up after" /tmp/b/A3.txt | tee -a $LOG
(cd $OUT && tar czf A3.tgz A3 && rm -rf A3)
