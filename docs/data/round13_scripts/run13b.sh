source .exp/gpu.sh
mkdir -p /tmp/b $OUT/prof
T0=$SECONDS
TORCH_LOGS=recompiles timeout 300 python3 -m fishserve bench-engine --modes graphs,graphs-opbyop --batch-sizes 1,64,256,512 \
  --context 200 --frames 48 --dummy-logits peaked --output $OUT/eng.json > $OUT/bench.txt 2>&1
echo "bench rc $? in $((SECONDS-T0)) s" > $OUT/log.txt
grep -iE "captur|fusing|recompil|fail|error|warn" $OUT/bench.txt | head -20 >> $OUT/log.txt
grep -E "│" $OUT/bench.txt >> $OUT/log.txt
T0=$SECONDS
timeout 150 python3 -m fishserve bench-engine --modes graphs --batch-sizes 64,256,512 \
  --context 200 --frames 24 --dummy-logits peaked --profile-steps 4 --output /tmp/b/prof.json > /tmp/b/prof.txt 2>&1
echo "profile rc $? in $((SECONDS-T0)) s" >> $OUT/log.txt
grep -iE "captur" /tmp/b/prof.txt >> $OUT/log.txt; grep -E "│" /tmp/b/prof.txt >> $OUT/log.txt
tar czf $OUT/prof/prof.tgz -C /tmp/b prof.json $(cd /tmp/b && ls prof_profile_*.txt)
T1=$SECONDS
timeout $((585 - SECONDS)) python3 -m pytest -p no:warnings tests/engine/test_compiled_codes.py tests/models/test_attention.py tests/engine/test_async_scheduling.py \
  tests/engine/test_decode_step.py tests/engine/test_host_copy.py tests/engine/test_sampling.py tests/engine/test_prefilter.py \
  -k "gpu or cuda or graph" > $OUT/tests.txt 2>&1
echo "tests rc $? in $((SECONDS-T1)) s" >> $OUT/log.txt
grep -E "passed|failed|Error|FAIL" $OUT/tests.txt | tail -8 >> $OUT/log.txt
cat $OUT/log.txt
