#!/usr/bin/env bash
# Start `fishserve serve` on 127.0.0.1:PORT, wait for /health, run `fishserve bench` against it
# once per argument group (groups separated by `---`), then stop the server. The server's log
# goes to serve.log in the first group's --output-dir (default bench_out).
#
# Usage: serve_and_bench.sh PORT "SERVE ARGS" BENCH ARGS... [--- BENCH ARGS...]...
# Example (CPU, tiny fixtures):
#   bash fishserve/bench/serve_and_bench.sh 18123 "--checkpoint tests/fixtures/tiny_t2s \
#     --decoder-checkpoint tests/fixtures/tiny_decoder/generator.pth \
#     --decoder-config tests/fixtures/tiny_decoder/config.json --device cpu --num-kv-blocks 256" \
#     --concurrency 1,2 --num-requests 4 --lengths short --max-new-tokens 8 --ignore-eos \
#     --output-dir /tmp/b1 --- --mode poisson --rate 5 --num-requests 4 --lengths short \
#     --max-new-tokens 8 --ignore-eos --output-dir /tmp/b2
# Environment: FISHSERVE (default: `fishserve` on PATH, else .venv/bin/fishserve),
# STARTUP_TIMEOUT (s, 900). Needs curl for the health check.
set -euo pipefail
if (($# < 2)); then
  echo "usage: $0 PORT \"SERVE ARGS\" BENCH ARGS... [--- BENCH ARGS...]..." >&2
  exit 2
fi
port=$1
serve_args=$2
shift 2
if [[ -n ${FISHSERVE:-} ]]; then
  fishserve=$FISHSERVE
elif command -v fishserve >/dev/null; then
  fishserve=fishserve
elif [[ -x .venv/bin/fishserve ]]; then
  fishserve=.venv/bin/fishserve
else
  echo "fishserve not found: activate its virtual environment or set FISHSERVE=/path/to/fishserve" >&2
  exit 2
fi
command -v curl >/dev/null || { echo "curl is needed for the health check" >&2; exit 2; }
url="http://127.0.0.1:$port"

out=bench_out
args=("$@")
for ((i = 0; i < ${#args[@]} - 1; i++)); do
  [[ ${args[i]} == --- ]] && break
  [[ ${args[i]} == --output-dir ]] && out=${args[i + 1]}
done
mkdir -p "$out"

# shellcheck disable=SC2086  # serve_args is a list of flags
$fishserve serve --host 127.0.0.1 --port "$port" $serve_args >"$out/serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
deadline=$((SECONDS + ${STARTUP_TIMEOUT:-900}))
until curl -sf -m 5 "$url/health" >/dev/null; do
  if ! kill -0 "$server" 2>/dev/null || ((SECONDS > deadline)); then
    echo "server did not start; end of $out/serve.log:" >&2
    tail -n 30 "$out/serve.log" >&2
    exit 1
  fi
  sleep 1
done

group=()
for arg in "$@" ---; do
  if [[ $arg == --- ]]; then
    ((${#group[@]})) && $fishserve bench --url "$url" "${group[@]}"
    group=()
  else
    group+=("$arg")
  fi
done
