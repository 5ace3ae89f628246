source .exp/gpu.sh
L=$OUT/log.txt
T0=$SECONDS
echo "== gpu tests" | tee -a $L
timeout 150 python3 -m pytest -p no:cacheprovider tests/engine/test_async_scheduling.py tests/engine/test_decode_step.py tests/engine/test_host_copy.py -k "gpu or cuda or graph" 2>&1 | grep -E "passed|failed|FAIL|Error" | tail -8 | tee -a $L
echo "== bench-engine $((SECONDS-T0))" | tee -a $L
timeout 260 python3 -m fishserve bench-engine --modes graphs,async --batch-sizes 1,64,256,512 --context 200 --frames 24 --dummy-logits peaked --output $OUT/eng.json 2>&1 | grep -E "^│|rror|Trace" | tee -a $L
for C in 20 10,40; do
  N=${C/,/_}
  B="python3 -m fishserve bench-decoder --device cuda --dtypes bf16 --modes triton --batch-sizes 1,8,16,32 --chunk $C --repeats 7"
  (( SECONDS - T0 > 480 )) && { echo "skip dec $C"; continue; }
  echo "== dec new $C $((SECONDS-T0))" | tee -a $L
  timeout 100 $B --output $OUT/dnew_$N.json 2>&1 | grep -E "^│|rror" | tee -a $L
  echo "== dec base $C $((SECONDS-T0))" | tee -a $L
  (cd .exp/base && PYTHONPATH=/tmp/site timeout 100 $B --output $OUT/dbase_$N.json 2>&1 | grep -E "^│|rror" | tee -a $L)
done
echo "== end $((SECONDS-T0))" | tee -a $L
