source .exp/gpu.sh
cp .exp/site/sitecustomize.py /tmp/site/
mkdir -p /tmp/b
LOG=$OUT/log.txt
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export STOP_S=390 PROCS=2 DUR=25 FS_PROBE=1
run_server G1 "$F --gil-switch-interval 0.0001" 384 448 > /tmp/b/G1.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
python3 .exp/probe_summ.py /tmp/b/probe_G1_l384 /tmp/b/probe_pre_G1_l384 2>&1 | grep -A12 "serve --host\|gil overs" | grep -v uvloop | head -60 >> $LOG
rm -f /tmp/b/probe_*.json
run_server G2 "$F --gil-switch-interval 0.00002" 384 448 > /tmp/b/G2.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
grep -E "skip|died|up after|cores|   [0-9]" /tmp/b/G1.txt /tmp/b/G2.txt | tee -a $LOG
python3 .exp/probe_summ.py /tmp/b/probe_G2_l384 /tmp/b/probe_pre_G2_l384 2>&1 | grep -A12 "serve --host\|gil overs" | grep -v uvloop | head -60 >> $LOG
mkdir -p $OUT/G; cp /tmp/b/G1.txt /tmp/b/G2.txt $OUT/G/; cp -r $OUT/G1 $OUT/G2 $OUT/G/ 2>/dev/null; rm -rf $OUT/G1 $OUT/G2
cd $OUT && tar czf G.tgz G && rm -rf G
