source .exp/gpu.sh
mkdir -p /tmp/b
L=$OUT/log.txt
T0=$SECONDS
timeout 150 python3 -m pytest -q -p no:warnings tests/audio/test_decoder_runner.py tests/server/test_decode_worker.py > /tmp/b/tests.txt 2>&1
echo "tests rc $? $((SECONDS-T0)) s" | tee -a $L; grep -E "passed|failed|Error" /tmp/b/tests.txt | tail -5 | tee -a $L
T0=$SECONDS
timeout 200 python3 -m fishserve bench-decoder --device cuda --dtypes bf16 --modes triton,triton-pipelined --batch-sizes 1,4,8,16 --chunk 10,40 --repeats 5 --output $OUT/dec.json > /tmp/b/dec.txt 2>&1
echo "bench-decoder rc $? $((SECONDS-T0)) s" | tee -a $L; grep -E "│ bf16" /tmp/b/dec.txt | tee -a $L
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export STOP_S=560
run_server P1 "$F" 320 384 448 > /tmp/b/P1.txt 2>&1
grep -E "^ *P1_l|== |skip|died" /tmp/b/P1.txt | tee -a $L
python3 .exp/summ.py /tmp/b | tee -a $L
echo "== end $SECONDS" | tee -a $L
