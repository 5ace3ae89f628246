source .exp/gpu.sh
mkdir -p /tmp/b
L=$OUT/log.txt
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export STOP_S=480
run_server G1 "$F --chunk-growth 1.5" 384 448 > /tmp/b/G1.txt 2>&1
run_server P2 "$F" 384 448 > /tmp/b/P2.txt 2>&1
run_server S2 "$F --no-decoder-pipeline" 384 448 > /tmp/b/S2.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $L
for t in G1 P2 S2; do grep -E "up after" /tmp/b/$t.txt | tee -a $L; grep -E "WARNING|ERROR" /tmp/serve_$t.log | cut -c1-160 | sort | uniq -c | sort -rn | head -4 | tee -a $L; done
echo "== end $SECONDS" | tee -a $L
