source .exp/gpu.sh
mkdir -p /tmp/b
L=$OUT/log.txt
export STOP_S=330
sed -i 's/^STEP_STREAM_PRIORITY = -1/STEP_STREAM_PRIORITY = 0/' fishserve/engine/runner.py
grep -n "^STEP_STREAM_PRIORITY" fishserve/engine/runner.py | tee -a $L
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12 --async-scheduling on"
run_server A2 "$F" 384 320 2>&1 | grep -v "^ \|^pid" | tee -a $L
echo "== end $SECONDS" | tee -a $L
