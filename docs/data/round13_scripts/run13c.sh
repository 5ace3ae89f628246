source .exp/gpu.sh
mkdir -p /tmp/b
L=$OUT/log.txt
B="--modes graphs --batch-sizes 1,64,256,512 --context 200 --frames 32 --dummy-logits peaked"
T0=$SECONDS
(cd .exp/base13 && PYTHONPATH=/tmp/site timeout 150 python3 -m fishserve bench-engine $B --output $OUT/eng_base.json > /tmp/b/eng_base.txt 2>&1)
echo "base bench rc $? $((SECONDS-T0)) s" | tee -a $L; grep -E "captured|│ bf16" /tmp/b/eng_base.txt | tee -a $L
T0=$SECONDS
timeout 150 python3 -m fishserve bench-engine $B --output $OUT/eng_new.json > /tmp/b/eng_new.txt 2>&1
echo "new bench rc $? $((SECONDS-T0)) s" | tee -a $L; grep -E "captured|│ bf16" /tmp/b/eng_new.txt | tee -a $L
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export STOP_S=500
run_server C1 "$F" 320 384 448 2>&1 | grep -v "^ \|^pid" | tee -a $L
grep -E "captured|compil" /tmp/serve_C1.log | head -5 | tee -a $L
echo "== end $SECONDS" | tee -a $L
