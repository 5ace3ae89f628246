# Round 29, device call 2 (warm): round 28's first chunk (A2: 10 frames, deadline 0.15 s) and B2 (8, 0.12) alternately
source docs/data/round29_scripts/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --stream-pipeline core"
export PROCS=2 DUR=30 STOP_S=250
run_server A2 "$F --first-chunk-deadline 0.15" 1000 1024 2>&1 | tee -a $LOG
export STOP_S=520
run_server B2 "$F --first-chunk-frames 8 --first-chunk-deadline 0.12" 1024 1000 2>&1 | tee -a $LOG
cd $OUT && tar czf res.tgz A2 B2 2>/dev/null; rm -rf A2 B2; echo "total $((SECONDS-T0)) s" | tee -a $LOG
