# session 21 call 1: async with a larger decoder share (112 / 104 SMs), 30 s levels, PROCS=2
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee -a $LOG
git log --oneline -1 | tee -a $LOG
F="--max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12 --async-scheduling"
export PROCS=2 DUR=30 STOP_S=470
run_server D1 "$F --decoder-sms 112" 384 448 > /tmp/b/D1.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
grep -E "skip|died|up after" /tmp/b/D1.txt | tee -a $LOG
run_server D2 "$F --decoder-sms 104" 384 448 > /tmp/b/D2.txt 2>&1
python3 .exp/summ.py /tmp/b/D2* | tee -a $LOG
grep -E "skip|died|up after" /tmp/b/D2.txt | tee -a $LOG
(cd $OUT && tar czf D.tgz D1 D2 && rm -rf D1 D2)
