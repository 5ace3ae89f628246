# Round 20, call 5 (as run, inline; same lease as calls 3 and 4): sync, 72 decoder SMs, 448 and 512 streams
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b; export PROCS=2 DUR=30 STOP_S=$((SECONDS + 200))
run_server E4 "--decoder-sms 72 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12" \
  448 512 > /tmp/b/E4.txt 2>&1
grep -hE "skip|died|up after" /tmp/b/E4.txt; python3 .exp/summ.py /tmp/b
