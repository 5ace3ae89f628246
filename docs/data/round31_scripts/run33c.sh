# Round 31, call 3 (as run): real-time admission as a cap (admit while the running streams
# are fewer than the engine's frame rate serves at 1.15 x real time each), with call 1's R8
# flags, at 1000 then 960 streams (I); then the GPU tests. Metrics sampler as in run33b.sh.
source docs/data/round29_scripts/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS
grep -m1 "model name" /proc/cpuinfo | tee -a $LOG; nproc | tee -a $LOG
( while sleep 1; do m=$(curl -s -m 1 127.0.0.1:18201/metrics | grep -E "^fishserve:(stream_frame_rate|admission_held_total|num_requests_running|num_requests_waiting|engine_steps_total|generation_frames_total) " | awk '{printf "%s=%s ", $1, $2}'); [[ -n $m ]] && echo "$SECONDS $m"; done > $OUT/ts.txt ) &
SAMPLER=$!
F="--early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --stream-pipeline core --first-chunk-deadline 0.15 --max-decode-batch 32 --decoder-call-overhead 256"
R8="$F --rebuffer-frames 24 --first-chunk-frames 8"
export PROCS=2 DUR=30 STOP_S=330
run_server I "$R8 --realtime-admission 1.15" 1000 960 2>&1 | tee -a $LOG
kill $SAMPLER
python3 docs/data/round29_scripts/split.py /tmp/b | tee -a $LOG  # first-chunk split, calls/s
python3 -m pytest -p no:cacheprovider -k "cuda or gpu or graph or triton or prefilter or static_rows or warm or probe" tests/engine tests/bench/test_device_probe.py tests/server/test_engine_process.py tests/server/test_relay.py > $OUT/t.txt 2>&1; echo "GPU tests rc=$?" | tee -a $LOG; tail -3 $OUT/t.txt | tee -a $LOG
cd $OUT && tar czf res.tgz I 2>/dev/null; rm -rf I; echo "total $((SECONDS-T0)) s" | tee -a $LOG
