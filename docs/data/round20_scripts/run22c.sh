# Round 20, call 3: async with 72 decoder SMs at 448/512/576; then bench-decoder (triton head)
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
git log --oneline -1 | tee -a $LOG
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 320))
F="--max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12 --async-scheduling"
run_server A5 "--decoder-sms 72 $F" 448 512 576 > /tmp/b/A5.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/A5.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b | tee -a $LOG
rm -f $OUT/*/serve.log $OUT/*/metrics.txt $OUT/*/health_*.json
D="python3 -m fishserve bench-decoder --device cuda --dtypes bf16 --modes triton --repeats 7"
timeout 90 $D --batch-sizes 1,8,16,32 --chunk 20 --output $OUT/dec_c20.json 2>&1 | tail -8 | tee -a $LOG
timeout 55 $D --batch-sizes 8,32 --chunk 64 --output $OUT/dec_c64.json 2>&1 | tail -5 | tee -a $LOG
timeout 55 $D --batch-sizes 1,8 --chunk 646 --whole-clips --output $OUT/dec_whole.json 2>&1 | tail -5 | tee -a $LOG
