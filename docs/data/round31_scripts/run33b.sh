# Round 31, call 2 (as run): E at 1000 as the lease's check, then R8 (call 1's best: E +
# --rebuffer-frames 24 --first-chunk-frames 8) with real-time admission 1.1 (G) and 1.15 (H)
# at 1000. A sampler logs the server's admission metrics every second to $OUT/ts.txt.
source docs/data/round29_scripts/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS
grep -m1 "model name" /proc/cpuinfo | tee -a $LOG; nproc | tee -a $LOG
( while sleep 1; do m=$(curl -s -m 1 127.0.0.1:18201/metrics | grep -E "^fishserve:(stream_frame_rate|admission_held_total|num_requests_running|num_requests_waiting|engine_steps_total|generation_frames_total) " | awk '{printf "%s=%s ", $1, $2}'); [[ -n $m ]] && echo "$SECONDS $m"; done > $OUT/ts.txt ) &
SAMPLER=$!
F="--early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --stream-pipeline core --first-chunk-deadline 0.15 --max-decode-batch 32 --decoder-call-overhead 256"
R8="$F --rebuffer-frames 24 --first-chunk-frames 8"
export PROCS=2 DUR=30 STOP_S=290
run_server E "$F" 1000 2>&1 | tee -a $LOG
export STOP_S=390
run_server G "$R8 --realtime-admission 1.1" 1000 2>&1 | tee -a $LOG
export STOP_S=490
run_server H "$R8 --realtime-admission 1.15" 1000 2>&1 | tee -a $LOG
kill $SAMPLER
python3 docs/data/round29_scripts/split.py /tmp/b | tee -a $LOG  # first-chunk split, calls/s
cd $OUT && tar czf res.tgz E G H 2>/dev/null; rm -rf E G H; echo "total $((SECONDS-T0)) s" | tee -a $LOG
