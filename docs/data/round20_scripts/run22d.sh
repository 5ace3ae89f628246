# Round 20, call 4 (as run, inline): bench-decoder in 20-frame chunks (call 3's run of it hit its time limit)
source .exp/gpu.sh >/dev/null; git log --oneline -1
timeout 250 python3 -m fishserve bench-decoder --device cuda --dtypes bf16 --modes triton --repeats 7 \
  --batch-sizes 1,16,32 --chunk 20 --output $OUT/dec_c20.json 2>&1 | tail -8
