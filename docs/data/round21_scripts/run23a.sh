# Round 21, call 1 (as run: round 20's next_round.sh). Before it, here:
#   bash docs/data/round19_scripts/fetch_wheels.sh
#   cp docs/data/round19_scripts/gpu.sh docs/data/round14_scripts/summ.py .exp/
# then on the device with carry [".whl", ".exp"], timeout 600. Its pytest lines were cut by
# `tail -6` (run23b.sh greps them); G1's 512/576 bench.json hit the device's file-count limit.
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
git log --oneline -1 | tee -a $LOG
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/engine/test_sm_partition.py \
  -rs 2>&1 | tail -6 | tee -a $LOG
F="--max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 500))
run_server G1 "--engine-sms 56 $F" 448 512 576 > /tmp/b/G1.txt 2>&1
run_server B1 "--decoder-sms 72 $F" 448 512 > /tmp/b/B1.txt 2>&1
grep -hE "skip|died|up after|SMs" /tmp/b/G1.txt /tmp/b/B1.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b | tee -a $LOG
rm -f $OUT/*/serve.log
