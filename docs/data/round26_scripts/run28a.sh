# Round 26, device call 1 (carry [".whl", ".exp"]; .exp/gpu.sh from round 19). The lease's
# probes; the GPU tests of bench-engine-load's SM partition and the device probe; the engine
# alone on the server's 56 engine SMs at 512-1024 streams; the same without the mid-step host
# round trip (fused_bound.py, inexact: an upper bound); a profiled window at 768 streams read
# with profile-gaps.
source .exp/gpu.sh >/dev/null; LOG=$OUT/log.txt; S=docs/data/round26_scripts
A="--modes async --duration 6 --warmup 2 --engine-sms 56"
python3 -m fishserve probe 2>&1 | tee -a $LOG
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv | tee -a $LOG
timeout 100 python3 -m pytest -p no:cacheprovider --junitxml=$OUT/t.xml -k "sm_partition or gpu_probe" \
  tests/bench/test_engine_load.py tests/bench/test_device_probe.py 2>&1 | tail -2 | tee -a $LOG
timeout 200 python3 -m fishserve bench-engine-load --streams 512,768,1024 $A --output $OUT/load.json \
  2>&1 | grep -v "━" | tail -9 | tee -a $LOG
timeout 130 python3 $S/fused_bound.py --streams 768,1024 $A --output $OUT/fused.json 2>&1 \
  | grep -v "━" | tail -7 | tee -a $LOG
export FISHSERVE_TORCH_PROFILER_DIR=/tmp/prof FISHSERVE_PROFILE_START_STEP=200 FISHSERVE_PROFILE_STEPS=20
timeout 110 python3 -m fishserve bench-engine-load --streams 768 $A --duration 3 2>&1 | grep -v "━" | tail -4 | tee -a $LOG
python3 -m fishserve profile-gaps /tmp/prof/engine_steps_*.json --top 25 2>&1 | tee $OUT/gaps.txt | tee -a $LOG
head -45 /tmp/prof/engine_steps_*.txt > $OUT/prof_table.txt; gzip -c /tmp/prof/engine_steps_*.json > $OUT/trace.json.gz
ls -la $OUT
