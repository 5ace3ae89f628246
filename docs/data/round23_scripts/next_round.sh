# Planned first call of the next round (not run yet). Run here first:
#   bash docs/data/round19_scripts/fetch_wheels.sh
#   cp docs/data/round19_scripts/gpu.sh docs/data/round14_scripts/summ.py .exp/
#   (summ.py: add boost={g('boost_share'):.2f} to its line, as round 23's runs printed)
# then on the device with carry [".whl", ".exp"], timeout 600 (a cold machine: ~165 s to the
# first level). Where the boosted server's edge lies: (1) what an engine step of a boost
# step's size costs against a full step's, alone (kernels per step by family, for the
# fewer-kernels work of §6.22/§6.23); (2) boost 64 at 640 and 672 on one lease with no boost at
# 640 beside it (round 23: 640 passed 2 of 2 boosted, failed unboosted on one machine).
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
git log --oneline -1 | tee -a $LOG
timeout 200 python3 -m fishserve bench-engine --kv-cache-dtypes bf16 --modes graphs \
  --batch-sizes 64,128,256,512 --context 200 --frames 24 --dummy-logits peaked \
  --profile-steps 4 --output $OUT/engine.json 2>&1 | tail -8 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --first-chunk-deadline 0.17"
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 560))
run_server B64 "$F --boost-frames 64" 640 672 > /tmp/b/B64.txt 2>&1
run_server N "$F" 640 > /tmp/b/N.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/B64.txt /tmp/b/N.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/B64_* /tmp/b/N_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz B64 N && rm -rf B64 N
