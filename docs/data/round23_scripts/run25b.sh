# Round 23, call 2: --boost-frames 12 and 20, sync, engine-sms 56
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
git log --oneline -1 | cut -c1-60 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --first-chunk-deadline 0.17"
export PROCS=2 DUR=30 STOP_S=520
run_server B12 "$F --boost-frames 12" 576 640 704 > /tmp/b/B12.txt 2>&1
run_server B20 "$F --boost-frames 20" 640 704 > /tmp/b/B20.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/B12.txt /tmp/b/B20.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/B12_* /tmp/b/B20_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz B12 B20 && rm -rf B12 B20
