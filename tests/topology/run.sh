#!/bin/bash
# tests/topology/run.sh: the docker/compose.yaml topology without containers. Starts three
# build/attnd replicas and Debian's nginx (docker/nginx.conf, rendered into a temp dir) as plain
# processes on 127.0.0.1, then checks that every call of a session lands on one replica, that
# sessions spread over the replicas, and that a killed replica fails its own sessions with the
# proxy's JSON 502 while the other replicas' sessions and stateless calls keep working.
#
# usage: tests/topology/run.sh [ATTND_BIN]   (default $ATTND_BIN, else build/attnd)
# env:   NGINX (default nginx on PATH or /usr/sbin/nginx), N_SESSIONS (default 48),
#        KEEP=1 keeps the temp dir (configs and logs) for a look afterwards.
# Needs no root: nginx runs with -p/-e in the temp dir, and all ports are free ephemeral ones.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ATTND=${1:-${ATTND_BIN:-$ROOT/build/attnd}}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
N_SESSIONS=${N_SESSIONS:-48}
N_REPLICAS=3

[ -x "$ATTND" ] || { echo "topology: no attnd binary at $ATTND (run make first)" >&2; exit 2; }
[ -x "$NGINX" ] || { echo "topology: nginx not found (apt-get install nginx, or set NGINX)" >&2; exit 2; }
command -v curl >/dev/null || { echo "topology: curl not found" >&2; exit 2; }

T=$(mktemp -d "${TMPDIR:-/tmp}/attnd-topology.XXXXXX")
# nginx workers drop to an unprivileged user when started by root: they must reach the temp dir.
chmod 755 "$T"
PIDS=()
N_PASS=0
N_FAIL=0

cleanup() {
    local p
    for p in "${PIDS[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    if [ "${KEEP:-0}" = 1 ] || [ "$N_FAIL" -gt 0 ]; then
        echo "topology: logs and configs kept in $T"
    else
        rm -rf "$T"
    fi
}
trap cleanup EXIT

pass() {
    N_PASS=$((N_PASS + 1))
    echo "  ok   $*"
}
fail() {
    N_FAIL=$((N_FAIL + 1))
    echo "  FAIL $*"
}
# expect COND OK_MESSAGE FAIL_MESSAGE: COND is a test(1) expression in one string, e.g. "3 = 3".
expect() {
    # shellcheck disable=SC2086 # the condition is split into test's words on purpose
    if [ $1 ]; then
        pass "$2"
    else
        fail "$3"
    fi
}

# Ports: bound all at once, so they are distinct, then released for the daemons to take.
read -r -a PORTS <<<"$(/usr/bin/python3 - "$((N_REPLICAS + 1))" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)"
PROXY_PORT=${PORTS[$N_REPLICAS]}
PROXY=http://127.0.0.1:$PROXY_PORT

# http METHOD URL [BODY [HEADER...]]: prints the status code; the body lands in $T/body and the
# response headers in $T/headers. 000 means no HTTP answer at all.
http() {
    local method=$1 url=$2 body=${3:-} h args=()
    shift 2
    [ $# -gt 0 ] && shift
    for h in "$@"; do
        args+=(-H "$h")
    done
    if [ -n "$body" ]; then
        args+=(-H 'Content-Type: application/json' --data-binary "$body")
    fi
    curl -sS -o "$T/body" -D "$T/headers" -w '%{http_code}' -X "$method" --max-time 30 \
        "${args[@]}" "$url" 2>"$T/curl.err" || true
}

# wait_http URL SECONDS: until URL answers 200.
wait_http() {
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        [ "$(http GET "$1")" = 200 ] && return 0
        sleep 0.1
    done
    return 1
}

# json_int FIELD: the first integer value of "FIELD" in $T/body.
json_int() {
    sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\\(-\\{0,1\\}[0-9][0-9]*\\).*/\\1/p" "$T/body" | head -1
}

# x_rows N SEED: an (N, HIDDEN) JSON array of hidden states, different for each seed.
x_rows() {
    awk -v n="$1" -v s="$2" -v h="$HIDDEN" 'BEGIN {
        printf "[";
        for (t = 0; t < n; t++) {
            printf "%s[", (t ? "," : "");
            for (i = 0; i < h; i++) {
                printf "%s%.4f", (i ? "," : ""), sin(0.37 * s + 0.11 * t + 0.013 * i);
            }
            printf "]";
        }
        printf "]";
    }'
}

echo "== topology: $N_REPLICAS attnd replicas + nginx on 127.0.0.1 (temp dir $T)"

# ---- start the replicas ---------------------------------------------------------------------
# The same preset and seed everywhere: replicas must hold the same weights, as in compose.yaml.
for ((r = 0; r < N_REPLICAS; r++)); do
    "$ATTND" --host 127.0.0.1 --port "${PORTS[$r]}" --preset tiny --seed 7 --workers 1 \
        --blas-threads 1 --kv-budget-mb 16 --log-level warn >"$T/attnd$r.log" 2>&1 &
    PIDS+=($!)
    REPLICA_PID[r]=$!
done
for ((r = 0; r < N_REPLICAS; r++)); do
    if ! wait_http "http://127.0.0.1:${PORTS[$r]}/readyz" 30; then
        echo "topology: replica $r did not become ready; its log:" >&2
        tail -20 "$T/attnd$r.log" >&2
        exit 1
    fi
done
[ "$(http GET "http://127.0.0.1:${PORTS[0]}/v1/model")" = 200 ] || {
    echo "topology: GET /v1/model failed" >&2
    exit 1
}
HIDDEN=$(json_int hidden_size)
[ -n "$HIDDEN" ] || { echo "topology: no hidden_size in /v1/model" >&2; exit 1; }

# ---- start nginx with the shipped config, rendered for 127.0.0.1 ----------------------------
mkdir -p "$T/nginx/logs"
sed -e "s|listen 8080;|listen 127.0.0.1:$PROXY_PORT;|" \
    -e "s|/var/log/nginx/|$T/nginx/logs/|" \
    "$ROOT/docker/nginx.conf" >"$T/nginx/attnd.conf"
for ((r = 0; r < N_REPLICAS; r++)); do
    sed -i "s|server attnd$((r + 1)):8080|server 127.0.0.1:${PORTS[$r]}|" "$T/nginx/attnd.conf"
done
if grep -qE 'attnd[0-9]:8080|listen 8080' "$T/nginx/attnd.conf"; then
    echo "topology: docker/nginx.conf no longer matches what this script renders" >&2
    exit 1
fi
# The main context that Debian's /etc/nginx/nginx.conf would give, minus every root-owned path.
cat >"$T/nginx/nginx.conf" <<EOF
worker_processes 1;
pid $T/nginx/nginx.pid;
error_log $T/nginx/logs/error.log warn;
events {
    worker_connections 256;
}
http {
    default_type application/octet-stream;
    client_body_temp_path $T/nginx/client_body;
    proxy_temp_path $T/nginx/proxy;
    fastcgi_temp_path $T/nginx/fastcgi;
    uwsgi_temp_path $T/nginx/uwsgi;
    scgi_temp_path $T/nginx/scgi;
    include $T/nginx/attnd.conf;
}
EOF
"$NGINX" -p "$T/nginx" -e "$T/nginx/logs/error.log" -c "$T/nginx/nginx.conf" -t \
    >"$T/nginx/configtest.log" 2>&1 || { cat "$T/nginx/configtest.log" >&2; exit 1; }
"$NGINX" -p "$T/nginx" -e "$T/nginx/logs/error.log" -c "$T/nginx/nginx.conf" \
    -g 'daemon off; master_process on;' >"$T/nginx/stdout.log" 2>&1 &
PIDS+=($!)
wait_http "$PROXY/healthz" 10 || {
    echo "topology: nginx did not answer; its error log:" >&2
    tail -20 "$T/nginx/logs/error.log" >&2
    exit 1
}

# owner_of ID: the replica index whose /v1/sessions/{id} answers 200, "none" or "many".
owner_of() {
    local r owner=none code
    for ((r = 0; r < N_REPLICAS; r++)); do
        code=$(http GET "http://127.0.0.1:${PORTS[$r]}/v1/sessions/$1")
        if [ "$code" = 200 ]; then
            [ "$owner" = none ] && owner=$r || owner=many
        fi
    done
    echo "$owner"
}

# ---- 1. every call of a session lands on one replica ----------------------------------------
echo "-- sessions stick to one replica ($N_SESSIONS sessions: prefill 3, decode 1 + 1, GET)"
declare -a OWNER COUNT=(0 0 0)
n_sticky=0
for ((s = 0; s < N_SESSIONS; s++)); do
    id="topo-$s"
    hdr="X-Session-Id: $id"
    ok=1
    code=$(http POST "$PROXY/v1/attend" "{\"session_id\":\"$id\",\"x\":$(x_rows 3 "$s")}" "$hdr")
    if [ "$code" != 200 ] || [ "$(json_int n_tokens)" != 3 ]; then
        ok=0
        why="prefill: $code $(head -c 200 "$T/body")"
    fi
    # expect_n_past makes the replica itself prove it holds the session's cache: a request routed
    # to another replica would meet an empty cache and answer 409.
    for n_past in 3 4; do
        [ $ok = 1 ] || break
        code=$(http POST "$PROXY/v1/attend" \
            "{\"session_id\":\"$id\",\"expect_n_past\":$n_past,\"x\":$(x_rows 1 "$((s + n_past))")}" "$hdr")
        [ "$code" = 200 ] || { ok=0; why="decode at n_past=$n_past: $code $(head -c 200 "$T/body")"; }
    done
    # The path alone (no header) must route to the same replica.
    if [ $ok = 1 ]; then
        code=$(http GET "$PROXY/v1/sessions/$id")
        [ "$code" = 200 ] || { ok=0; why="GET /v1/sessions/$id via proxy: $code"; }
    fi
    owner=$(owner_of "$id")
    case $owner in
        none | many) [ $ok = 1 ] && { ok=0; why="held by $owner of the replicas"; } ;;
        *) COUNT[owner]=$((COUNT[owner] + 1)) ;;
    esac
    OWNER[s]=$owner
    if [ $ok = 1 ]; then
        n_sticky=$((n_sticky + 1))
    else
        fail "session $id: $why"
    fi
done
[ $n_sticky = "$N_SESSIONS" ] && pass "$n_sticky/$N_SESSIONS sessions: all calls on one replica, held by exactly one"

# A stream through the proxy: nginx must pass the events through unbuffered and intact.
code=$(http POST "$PROXY/v1/attend" \
    "{\"session_id\":\"topo-1\",\"expect_n_past\":5,\"stream\":true,\"x\":$(x_rows 3 42)}" \
    "X-Session-Id: topo-1")
n_events=$(grep -c '^data: {"index":' "$T/body" || true)
if [ "$code" = 200 ] && [ "$n_events" = 3 ] && grep -q '"n_tokens":8' "$T/body" &&
    [ "$(tail -n 2 "$T/body" | head -n 1)" = "data: [DONE]" ]; then
    pass "stream through the proxy: 3 token events, usage, [DONE]"
else
    fail "stream through the proxy: $code, $n_events events: $(head -c 200 "$T/body")"
fi
http POST "$PROXY/v1/sessions/topo-1/truncate" '{"n_tokens":5}' >/dev/null

# A fork's copy is made on its source's replica (the path routes the fork there); requests naming
# the copy reach it by sending the source's id as X-Route-Key.
child="topo-0.fork"
code=$(http POST "$PROXY/v1/sessions/topo-0/fork" "{\"new_id\":\"$child\"}")
if [ "$code" = 201 ]; then
    code=$(http POST "$PROXY/v1/attend" \
        "{\"session_id\":\"$child\",\"expect_n_past\":5,\"x\":$(x_rows 1 99)}" \
        "X-Session-Id: $child" "X-Route-Key: topo-0")
    o=$(owner_of "$child")
    if [ "$code" = 200 ] && [ "$o" = "${OWNER[0]}" ]; then
        pass "fork: the copy lives on its source's replica and X-Route-Key reaches it"
    else
        fail "fork: decode on the copy $code, held by replica $o (source on ${OWNER[0]})"
    fi
    http DELETE "$PROXY/v1/sessions/$child" "" "X-Route-Key: topo-0" >/dev/null
else
    fail "fork through the proxy: $code $(head -c 200 "$T/body")"
fi

# ---- 2. sessions spread over the replicas ----------------------------------------------------
echo "-- spread over replicas: ${COUNT[*]}"
spread_ok=1
for ((r = 0; r < N_REPLICAS; r++)); do
    [ "${COUNT[$r]}" -gt 0 ] || spread_ok=0
done
expect "$spread_ok = 1" "every replica holds sessions (${COUNT[*]})" \
    "some replica holds no session (${COUNT[*]})"

# Stateless calls (no session id) go anywhere and leave nothing behind.
n_ok=0
for ((i = 0; i < 6; i++)); do
    [ "$(http POST "$PROXY/v1/attend" "{\"x\":$(x_rows 2 "$((100 + i))")}")" = 200 ] && n_ok=$((n_ok + 1))
done
expect "$n_ok = 6" "stateless calls through the proxy: 6/6" "stateless calls: $n_ok/6"

# ---- 3. a dead replica fails its own sessions only -------------------------------------------
VICTIM=0
echo "-- kill replica $VICTIM (SIGTERM; it holds ${COUNT[$VICTIM]} sessions)"
kill -TERM "${REPLICA_PID[$VICTIM]}"
status=0
wait "${REPLICA_PID[$VICTIM]}" || status=$?
expect "$status = 0" "replica $VICTIM drained and exited 0 on SIGTERM" \
    "replica $VICTIM exited $status on SIGTERM"

n_dead_ok=0 n_live_ok=0 n_dead=0 n_live=0
for ((s = 0; s < N_SESSIONS; s++)); do
    id="topo-$s"
    owner=${OWNER[$s]}
    case $owner in none | many) continue ;; esac
    code=$(http POST "$PROXY/v1/attend" \
        "{\"session_id\":\"$id\",\"expect_n_past\":5,\"x\":$(x_rows 1 "$((s + 5))")}" "X-Session-Id: $id")
    if [ "$owner" = $VICTIM ]; then
        n_dead=$((n_dead + 1))
        if [ "$code" = 502 ] && grep -qi '^content-type: application/json' "$T/headers" &&
            grep -q '"code":"replica_unavailable"' "$T/body"; then
            n_dead_ok=$((n_dead_ok + 1))
        else
            fail "session $id on the dead replica: $code $(head -c 200 "$T/body")"
        fi
    else
        n_live=$((n_live + 1))
        if [ "$code" = 200 ] && [ "$(json_int n_past)" = 5 ]; then
            n_live_ok=$((n_live_ok + 1))
        else
            fail "session $id on a live replica: $code $(head -c 200 "$T/body")"
        fi
    fi
done
[ $n_dead_ok = $n_dead ] && pass "dead replica's sessions: $n_dead_ok/$n_dead got JSON 502 replica_unavailable"
[ $n_live_ok = $n_live ] && pass "live replicas' sessions: $n_live_ok/$n_live decoded on (n_past 5)"

# The dead replica's sessions were not quietly re-created elsewhere.
n_leaked=0
for ((s = 0; s < N_SESSIONS; s++)); do
    [ "${OWNER[$s]}" = $VICTIM ] || continue
    o=$(owner_of "topo-$s")
    [ "$o" = none ] || n_leaked=$((n_leaked + 1))
done
expect "$n_leaked = 0" "no session of the dead replica reappeared on another replica" \
    "$n_leaked sessions of the dead replica reappeared elsewhere"

n_ok=0
for ((i = 0; i < 6; i++)); do
    [ "$(http POST "$PROXY/v1/attend" "{\"x\":$(x_rows 2 "$((200 + i))")}")" = 200 ] && n_ok=$((n_ok + 1))
done
expect "$n_ok = 6" "stateless calls with a replica down: 6/6" \
    "stateless calls with a replica down: $n_ok/6"

# The surviving replicas drain too (under ASan, a leak would show here as a non-zero exit).
n_ok=0
for ((r = 0; r < N_REPLICAS; r++)); do
    [ $r = $VICTIM ] && continue
    kill -TERM "${REPLICA_PID[$r]}"
    status=0
    wait "${REPLICA_PID[$r]}" || status=$?
    [ $status = 0 ] && n_ok=$((n_ok + 1))
done
expect "$n_ok = $((N_REPLICAS - 1))" "the other replicas exited 0 on SIGTERM" \
    "only $n_ok of $((N_REPLICAS - 1)) other replicas exited 0 on SIGTERM"

echo "== topology: $N_PASS passed, $N_FAIL failed"
if [ $N_FAIL -gt 0 ]; then
    for f in "$T"/attnd*.log "$T/nginx/logs/error.log"; do
        echo "--- tail $f"
        tail -5 "$f"
    done
    exit 1
fi
