source .exp/gpu.sh
mkdir -p /tmp/b
L=$OUT/log.txt
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export STOP_S=420
run_server S1 "$F --no-decoder-pipeline" 320 384 448 > /tmp/b/S1.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $L
grep -E "WARNING|ERROR" /tmp/serve_S1.log | cut -c1-200 | sort | uniq -c | sort -rn | head -8 | tee -a $L
T0=$SECONDS
timeout 170 python3 -m pytest -q -p no:warnings tests/audio/test_decoder_runner.py -k "cuda" > /tmp/b/tests.txt 2>&1
echo "tests rc $? $((SECONDS-T0)) s" | tee -a $L; grep -E "passed|failed|Error" /tmp/b/tests.txt | tail -5 | tee -a $L
echo "== end $SECONDS" | tee -a $L
