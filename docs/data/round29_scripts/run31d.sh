# Round 29, device calls 4 and 5 (second lease, warm), as run inline: round 28's flags (A4) at 960, 896; then (A5) at 832
source docs/data/round29_scripts/gpu.sh >/dev/null
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --stream-pipeline core --first-chunk-deadline 0.15"
# call 4
export PROCS=2 DUR=30 STOP_S=200
run_server A4 "$F" 960 896 2>&1 | grep -E "L[0-9]|up after|died" > $OUT/log.txt
# call 5
export STOP_S=100
run_server A5 "$F" 832 2>&1 | grep -E "L[0-9]|up after|died" > $OUT/log.txt
