source .exp/gpu.sh
cp .exp/site/sitecustomize.py /tmp/site/
mkdir -p /tmp/b
LOG=$OUT/log.txt
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export STOP_S=330 PROCS=2 DUR=25 FS_PROBE=1
run_server Q3 "$F" 384 > /tmp/b/Q3.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
grep -E "skip|died|up after|cores|   [0-9]" /tmp/b/Q3.txt | tee -a $LOG
python3 .exp/probe_summ.py /tmp/b/probe_Q3_l384 /tmp/b/probe_pre_Q3_l384 >> $LOG 2>&1
mkdir -p $OUT/Q3; cp /tmp/b/Q3.txt $OUT/Q3/; cp -r /tmp/b/probe_Q3_l384 $OUT/Q3/
cd $OUT && tar czf Q3.tgz Q3 && rm -rf Q3
