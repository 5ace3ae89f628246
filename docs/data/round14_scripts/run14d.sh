source .exp/gpu.sh
mkdir -p /tmp/b
L=$OUT/log.txt
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export STOP_S=470
run_server P3 "$F" 384 416 448 > /tmp/b/P3.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $L
grep -E "up after" /tmp/b/P3.txt | tee -a $L; grep -E "WARNING|ERROR" /tmp/serve_P3.log | cut -c1-160 | sort | uniq -c | sort -rn | head -4 | tee -a $L
grep -E "time_to_first_audio_seconds_bucket.le=\"0.5\"|time_to_first_audio_seconds_count" $OUT/P3/metrics.txt | tee -a $L
cd $OUT && tar czf P3.tgz P3 && rm -rf P3
echo "== end $SECONDS" | tee -a $L
