# Round 28, device calls 3 and 4 (same lease, warm), as run inline:
source .exp/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --first-chunk-deadline 0.15"
# call 3
export PROCS=2 DUR=30 STOP_S=400
run_server C4 "$F --stream-pipeline core" 960 1024 896
export STOP_S=500
(( SECONDS - T0 < 330 )) && run_server H4 "$F --stream-pipeline http" 896
# call 4
export STOP_S=200
run_server C5 "$F --stream-pipeline core" 1000 1024
python3 -m pytest -p no:cacheprovider -k "cuda or gpu or graph or triton or prefilter or static_rows or warm or probe" tests/engine tests/bench/test_device_probe.py tests/server/test_engine_process.py tests/server/test_relay.py
