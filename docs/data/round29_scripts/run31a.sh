# Round 29, device call 1 (cold): first chunk of 8 frames, deadline 0.12 s (B1) at 1000, 1024, 1000
source docs/data/round29_scripts/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --stream-pipeline core"
export PROCS=2 DUR=30 STOP_S=470
python3 -m fishserve probe 2>&1 | tail -2 | tee -a $LOG
run_server B1 "$F --first-chunk-frames 8 --first-chunk-deadline 0.12" 1000 1024 1000 1024 2>&1 | tee -a $LOG
cd $OUT && tar czf res.tgz B1 2>/dev/null; rm -rf B1; echo "total $((SECONDS-T0)) s" | tee -a $LOG
