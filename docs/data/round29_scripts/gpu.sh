# source me on the device: defines run_server TAG "FLAGS" LEVELS... (round 27's, with the first-chunk histograms in each level's metrics.txt)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
BEST="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.2 --early-chunk-margin 0.12"
fs() { python3 -m fishserve "$@"; }
bench_cmd() {  # the load generator of BENCH_DIR (default: this tree)
  if [[ -n ${BENCH_DIR:-} ]]; then (cd $BENCH_DIR && PYTHONPATH=/tmp/site:$BENCH_DIR python3 -m fishserve bench "$@")
  else python3 -m fishserve bench "$@"; fi
}
run_server() {  # TAG FLAGS LEVELS...
  local tag=$1 flags=$2; shift 2
  local port=18201 t0=$SECONDS
  python3 -m fishserve serve --host 127.0.0.1 --port $port --load-format dummy --dummy-logits peaked \
    --gpu-memory-budget 40GiB --max-num-seqs 1024 --max-num-batched-tokens 4096 --max-waiting 4096 \
    --request-timeout 300 $flags > /tmp/serve_$tag.log 2>&1 &
  local pid=$!
  until curl -sf -m 5 127.0.0.1:$port/health >/dev/null; do
    kill -0 $pid 2>/dev/null || { echo "server $tag died"; tail -30 /tmp/serve_$tag.log; return 1; }
    sleep 1
  done
  echo "== $tag up after $((SECONDS-t0)) s"
  mkdir -p $OUT/$tag; curl -s -m 5 127.0.0.1:$port/health > $OUT/$tag/health_start.json
  for L in "$@"; do
    if [[ -n ${STOP_S:-} ]] && (( SECONDS > STOP_S )); then echo "skip $tag L$L"; continue; fi
    local T=${tag}_l$L; [[ -d /tmp/b/$T ]] && T=${T}b
    [[ -n ${PRE_LEVEL:-} ]] && eval "$PRE_LEVEL"
    ( sleep 12; mkdir -p /tmp/b/probe_pre_$T; cp /tmp/b/probe_*.json /tmp/b/probe_pre_$T/ 2>/dev/null ) &
    ( sleep 14; python3 .exp/cpu_snap.py /tmp/b/cpuA_$T.json; sleep 10; python3 .exp/cpu_snap.py /tmp/b/cpuB_$T.json ) &
    bench_cmd --url http://127.0.0.1:$port --concurrency $L --ramp 8 --lengths short \
      --max-new-tokens 216 --ignore-eos --warmup 2 --duration ${DUR:-15} --timeout 40 ${PROCS:+--processes $PROCS} \
      --output-dir /tmp/b/$T > /tmp/b_${tag}_$L.txt 2>&1 || tail -5 /tmp/b_${tag}_$L.txt
    python3 .exp/summ.py /tmp/b/$T
    python3 .exp/cpu_diff.py /tmp/b/cpuA_$T.json /tmp/b/cpuB_$T.json 2>&1 | head -30 > /tmp/b/$T/cpu.txt; cat /tmp/b/$T/cpu.txt
    mkdir -p /tmp/b/probe_$T; cp /tmp/b/probe_*.json /tmp/b/probe_$T/ 2>/dev/null
    curl -s 127.0.0.1:$port/metrics | grep -E "^fishserve:((request_queue_time|time_to_first_audio|first_chunk_decode)_seconds|first_chunk_frames)_(bucket|sum|count)" > /tmp/b/$T/metrics.txt
    mkdir -p $OUT/$tag; cp /tmp/b/$T/bench.json $OUT/$tag/$T.json 2>/dev/null
  done
  curl -s -m 5 127.0.0.1:$port/health > $OUT/$tag/health_end.json
  kill $pid; wait $pid
  grep -E "WARNING|ERROR|captured|slow" /tmp/serve_$tag.log | tail -8
  mkdir -p $OUT/$tag; cp /tmp/b/${tag}_l*/bench.json $OUT/$tag/ 2>/dev/null
  for d in /tmp/b/${tag}_l*; do cp $d/bench.json $OUT/$tag/$(basename $d).json; cat $d/metrics.txt >> $OUT/$tag/metrics.txt; done
  rm -f $OUT/$tag/bench.json; cp /tmp/serve_$tag.log $OUT/$tag/serve.log
}
