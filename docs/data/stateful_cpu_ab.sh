#!/bin/bash
# usage: cpu_ab.sh TREE PORT
TREE=$1; PORT=$2
cd $TREE
PYTHONPATH=$TREE /work/main/.venv/bin/python -m fishserve serve --load-format dummy --port $PORT > /tmp/ab_$PORT.log 2>&1 &
PID=$!
for i in $(seq 200); do curl -sf -m 2 localhost:$PORT/health >/dev/null && break; sleep 1; done
for rep in 1 2; do
  T0=$(date +%s.%N)
  curl -s localhost:$PORT/v1/tts -H 'content-type: application/json' -d '{"text": "Hello from fishserve, a longer sentence to stream.", "max_new_tokens": 128, "ignore_eos": true, "seed": 1, "streaming": true, "format": "pcm"}' -o /tmp/ab_$PORT.pcm
  T1=$(date +%s.%N)
  echo "rep $rep total $(echo "$T1 - $T0" | bc) s, bytes $(stat -c %s /tmp/ab_$PORT.pcm)"
done
curl -s localhost:$PORT/metrics | grep -E 'gpu_busy_seconds_total|decoder_calls_total |decoder_frames_total '
kill $PID; wait $PID 2>/dev/null
