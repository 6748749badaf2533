#!/bin/sh
# proto/examples/capture.sh: records the response examples that depend on the engine's seeded
# weights, from a real `attnd --preset tiny --seed 0 --keep-queries 1` (for the cached-attention
# example; its KV pool then holds queries too, which kv_bytes_per_token counts), by posting the
# request examples in order.
# Timing values in the records are whatever this run measured; tests ignore them.
#
# usage: proto/examples/capture.sh [ATTND_BIN]     (default build/attnd; run from the repo root)
set -eu
BIN=${1:-build/attnd}
DIR=$(dirname "$0")
LOG=$(mktemp)
"$BIN" --preset tiny --seed 0 --port 0 --workers 1 --keep-queries 1 2>"$LOG" &
PID=$!
trap 'kill $PID 2>/dev/null; rm -f "$LOG"' EXIT
for _ in $(seq 50); do
    PORT=$(sed -n 's/.*listening .*port=\([0-9]*\).*/\1/p' "$LOG")
    [ -n "$PORT" ] && break
    sleep 0.1
done
B=http://127.0.0.1:$PORT
post() { curl -sS -X POST "$B$1" -H 'Content-Type: application/json' --data-binary "@$DIR/$2"; }
post /v1/attend attend_stateless.request.json >"$DIR/attend_stateless.response.json"
post /v1/attend attend_prefill.request.json >"$DIR/attend_prefill.response.json"
post /v1/attend attend_decode.request.json >"$DIR/attend_decode.response.json"
post /v1/attend attend_base64.request.json >"$DIR/attend_base64.response.json"
post /v1/attend attend_stream.request.json >"$DIR/attend_stream.response.txt"
post /v1/attend error.request.json >"$DIR/error.response.json"
post /v1/attend attend_select.request.json >"$DIR/attend_select.response.json"
curl -sS "$B/v1/sessions/inspect-1/attention?heads=0,-1&rows=1:" >"$DIR/session_attention.response.json"
curl -sS "$B/v1/sessions/chat-42" >"$DIR/session_get.response.json"
post /v1/sessions/chat-42/truncate truncate.request.json >"$DIR/truncate.response.json"
post /v1/sessions/chat-42/fork fork.request.json >"$DIR/fork.response.json"
post /v1/attend attend_batch.request.json >"$DIR/attend_batch.response.json"
curl -sS "$B/v1/sessions" >"$DIR/sessions_list.response.json"
curl -sS "$B/v1/model" >"$DIR/model.response.json"
curl -sS "$B/healthz" >"$DIR/healthz.response.json"
curl -sS "$B/readyz" >"$DIR/readyz.response.json"
kill -TERM $PID
wait $PID
echo "captured from $BIN on port $PORT"
