# Planned first call of the next round (not run yet; run26f.sh ran out of device time). Set up
# here first, as round 23's next_round.sh says (wheels, .exp/gpu.sh, .exp/summ.py with the boost
# share), then on the device with carry [".whl", ".exp"], timeout 600, a full session's budget:
# (1) every CUDA test of the engine on the tree with the persistent batch (tests/engine, only
# those that need CUDA: on the CPU they skip); (2) async + boost 64 + 0.15 s deadline at 672 and
# 704 on that tree (round 24: 672 passed 1 of 1, 704 missed narrowly); (3) if time is left, the
# engine step profile of round 23's next_round.sh (bench-engine --profile-steps).
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; LOG=$OUT/log.txt
timeout 300 python3 -m pytest -p no:cacheprovider --junitxml=$OUT/gpu_tests.xml \
  -k "cuda or gpu or graph or triton" tests/engine 2>&1 | tail -3 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling"
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 250))
run_server D15n "$F --first-chunk-deadline 0.15" 672 704 > /tmp/b/D15n.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/D15n.txt | tee -a $LOG
python3 .exp/summ.py /tmp/b/D15n_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz D15n && rm -rf D15n
