#!/usr/bin/env bash
# The GPU suite's part i: rewards scored beside sampling (`reward.overlap`) against a reward server
# that answers each request after a fixed delay, as a judge or OCR service would. Starts
# examples/reward_server.py on a free loopback port and runs `bench step --overlap-ab ROUNDS`, which
# alternates overlapped and serial steps and reports the share of the scoring hidden.
#   scripts/gpu/overlap.sh PYTHON DELAY CHUNK JSON FLOWTUNE_ARGS…
# CHUNK is the images per request (the recipe's rollout.batch_size should match, so that each
# sampled chunk is one request).
set -euo pipefail
PYTHON=$1 DELAY=$2 CHUNK=$3 JSON=$4
shift 4
LOG=$(mktemp)
"$PYTHON" examples/reward_server.py --port 0 --delay "$DELAY" >"$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; rm -f "$LOG"' EXIT
PORT=
for _ in $(seq 100); do
    PORT=$(sed -n 's/^listening on \([0-9]*\)$/\1/p' "$LOG")
    [[ -n "$PORT" ]] && break
    kill -0 $SERVER 2>/dev/null || { cat "$LOG" >&2; exit 1; }
    sleep 0.1
done
[[ -n "$PORT" ]] || { echo "overlap: the reward server did not start" >&2; exit 1; }
"$@" --reward http --json "$JSON" \
    "reward.functions=[{name: http, url: 'http://127.0.0.1:$PORT/score', http: {batch_size: $CHUNK, max_concurrency: 1}}]"
