source .exp/gpu.sh
mkdir -p /tmp/b
L=$OUT/log.txt
export STOP_S=520
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
run_server A1 "$F" 320 384 448 2>&1 | tee -a $L
run_server O1 "$F --async-scheduling off" 384 2>&1 | tee -a $L
echo "== end $SECONDS" | tee -a $L
