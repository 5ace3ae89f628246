# Round 20, call 1: GPU tests (background) while the server starts; sync, decoder SMs 96, 512-640 streams
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
git log --oneline -1 | tee -a $LOG
nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a $LOG
( timeout 420 python3 -m pytest -q -p no:cacheprovider tests/models/test_triton_head.py \
  tests/audio/test_decoder_runner.py -rs > $OUT/pytest_gpu.txt 2>&1; echo "pytest rc $?" >> $OUT/pytest_gpu.txt ) &
TP=$!
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 475))
run_server E1 "$F" 512 576 640 > /tmp/b/E1.txt 2>&1
cat /tmp/b/E1.txt | grep -E "skip|died|up after" | tee -a $LOG
python3 .exp/summ.py /tmp/b | tee -a $LOG
wait $TP; tail -15 $OUT/pytest_gpu.txt | tee -a $LOG
