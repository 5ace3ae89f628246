source .exp/gpu.sh
mkdir -p /tmp/b
nvidia-smi --query-gpu=name,memory.used --format=csv > $OUT/log.txt
T0=$SECONDS
timeout 430 python3 -m fishserve bench-engine --modes graphs-opbyop,graphs --batch-sizes 1,64,256,512 \
  --context 200 --frames 24 --dummy-logits peaked --profile-steps 4 --output $OUT/eng.json > $OUT/bench.txt 2>&1
echo "bench rc $? in $((SECONDS-T0)) s" >> $OUT/log.txt
grep -v "^\s*$" $OUT/bench.txt | grep -iE "captur|fusing|compile|fail|error|warn" | head -20 >> $OUT/log.txt
tail -40 $OUT/bench.txt >> $OUT/log.txt
T1=$SECONDS
timeout $((585 - SECONDS)) python3 -m pytest -p no:warnings -x tests/engine/test_compiled_codes.py tests/engine/test_async_scheduling.py \
  tests/engine/test_decode_step.py tests/engine/test_host_copy.py tests/engine/test_sampling.py tests/engine/test_prefilter.py \
  -k "gpu or cuda or graph" > $OUT/tests.txt 2>&1
echo "tests rc $? in $((SECONDS-T1)) s" >> $OUT/log.txt
grep -E "passed|failed|Error" $OUT/tests.txt | tail -5 >> $OUT/log.txt
cat $OUT/log.txt
