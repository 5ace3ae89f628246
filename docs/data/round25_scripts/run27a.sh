# Round 25, call 1: GPU tests on the persistent batch; step profile; async+boost64 D0.15 at 672/704.
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt; T0=$SECONDS
timeout 220 python3 -m pytest -p no:cacheprovider --junitxml=$OUT/gpu_tests.xml \
  -k "cuda or gpu or graph or triton" tests/engine 2>&1 | tail -3 | tee -a $LOG
echo "tests done at $((SECONDS-T0)) s" | tee -a $LOG
timeout 150 python3 -m fishserve bench-engine --kv-cache-dtypes bf16 --modes graphs \
  --batch-sizes 64,512 --context 200 --frames 16 --dummy-logits peaked \
  --profile-steps 4 --output $OUT/engine.json 2>&1 | tail -6 | tee -a $LOG
echo "profile done at $((SECONDS-T0)) s" | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling"
export PROCS=2 DUR=30 STOP_S=$((T0 + 500))
run_server D15n "$F --first-chunk-deadline 0.15" 672 704 > /tmp/b/D15n.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/D15n.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/D15n_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz D15n && rm -rf D15n
