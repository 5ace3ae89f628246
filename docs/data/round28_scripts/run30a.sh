# Round 28, device call 1: relay (stream_pipeline http, the default) at 768 (warm), 896, 960, 1024
source .exp/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --first-chunk-deadline 0.15"
export PROCS=2 DUR=30 STOP_S=470
python3 -m fishserve probe 2>&1 | tail -4 | tee -a $LOG
run_server H1 "$F --stream-pipeline http" 768 896 960 1024 2>&1 | tee -a $LOG
cd $OUT && tar czf res.tgz H1 2>/dev/null; rm -rf H1; echo "total $((SECONDS-T0)) s" | tee -a $LOG
