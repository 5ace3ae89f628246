# Round 28, device call 2: relay + channel (H3) at 832, 896, 960; then the core pipeline + channel (C3) at 896
source .exp/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --first-chunk-deadline 0.15"
export PROCS=2 DUR=30 STOP_S=420
python3 -m fishserve probe 2>&1 | tail -2 | tee -a $LOG
run_server H3 "$F --stream-pipeline http" 832 896 960 2>&1 | tee -a $LOG
export STOP_S=520
(( SECONDS - T0 < 440 )) && run_server C3 "$F --stream-pipeline core" 896 2>&1 | tee -a $LOG
cd $OUT && tar czf res.tgz H3 C3 2>/dev/null; rm -rf H3 C3; echo "total $((SECONDS-T0)) s" | tee -a $LOG
