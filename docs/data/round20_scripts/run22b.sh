# Round 20, call 2: clean levels (no tests beside): sync, decoder SMs 96 at 448/512/576, then 72 at 512/576
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
git log --oneline -1 | tee -a $LOG
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 500))
F="--max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
run_server E2 "--decoder-sms 96 $F" 448 512 576 > /tmp/b/E2.txt 2>&1
run_server E3 "--decoder-sms 72 $F" 512 576 > /tmp/b/E3.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/E2.txt /tmp/b/E3.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b | tee -a $LOG
rm -f $OUT/*/serve.log
