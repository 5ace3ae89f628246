# Planned first call of the next round (not run yet). Run here first:
#   bash docs/data/round19_scripts/fetch_wheels.sh
#   cp docs/data/round19_scripts/gpu.sh docs/data/round14_scripts/summ.py .exp/
# then on the device with carry [".whl", ".exp"], timeout 600. Sync, 56 SMs reserved for the
# engine: a lower first-chunk deadline (0.15) at 448/480 streams, then 64 reserved SMs.
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 470))
run_server H1 "--engine-sms 56 --first-chunk-deadline 0.15 $F" 448 480 > /tmp/b/H1.txt 2>&1
run_server H2 "--engine-sms 64 --first-chunk-deadline 0.17 $F" 448 480 > /tmp/b/H2.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/H1.txt /tmp/b/H2.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz H1 H2 && rm -rf H1 H2
