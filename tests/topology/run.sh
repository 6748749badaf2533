#!/bin/bash
# tests/topology/run.sh: the docker/compose.yaml topology without containers. Starts three
# build/attnd replicas and Debian's nginx (docker/nginx.conf, rendered into a temp dir) as plain
# processes on 127.0.0.1, then checks that every call of a session lands on one replica, that
# sessions spread over the replicas, that a replica can be drained (README.md's procedure: out of
# nginx, its sessions exported and PUT through the proxy, stopped) with every session continuing
# bit for bit, and that a killed replica fails its own sessions with the proxy's JSON 502 while
# the other replicas' sessions and stateless calls keep working.
#
# usage: tests/topology/run.sh [ATTND_BIN]   (default $ATTND_BIN, else build/attnd)
# env:   NGINX (default nginx on PATH or /usr/sbin/nginx), N_SESSIONS (default 48), N_DRAIN
#        (sessions made for the drain, default 24), KEEP=1 keeps the temp dir (configs and logs).
# Needs no root: nginx runs with -p/-e in the temp dir, and all ports are free ephemeral ones.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ATTND=${1:-${ATTND_BIN:-$ROOT/build/attnd}}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
N_SESSIONS=${N_SESSIONS:-48}
N_DRAIN=${N_DRAIN:-24}
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

# json_output: the "output" of a one-token /v1/attend answer in $T/body, as the server wrote it.
json_output() {
    grep -o '"output":\[\[[^]]*\]\]' "$T/body" | head -1 || true
}

# put_file URL FILE [HEADER...]: PUTs FILE as application/octet-stream; like http otherwise.
put_file() {
    local url=$1 file=$2 h args=()
    shift 2
    for h in "$@"; do
        args+=(-H "$h")
    done
    curl -sS -o "$T/body" -D "$T/headers" -w '%{http_code}' -X PUT --max-time 30 \
        -H 'Content-Type: application/octet-stream' --data-binary "@$file" \
        "${args[@]}" "$url" 2>"$T/curl.err" || true
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
# nginx_ctl ARG...: this nginx, with its prefix, config and error log.
nginx_ctl() {
    "$NGINX" -p "$T/nginx" -e "$T/nginx/logs/error.log" -c "$T/nginx/nginx.conf" "$@"
}
nginx_ctl -t >"$T/nginx/configtest.log" 2>&1 || { cat "$T/nginx/configtest.log" >&2; exit 1; }
# Started as itself (not through nginx_ctl, a function, whose background copy is a subshell):
# NGINX_PID is nginx's master, the parent of its workers.
"$NGINX" -p "$T/nginx" -e "$T/nginx/logs/error.log" -c "$T/nginx/nginx.conf" \
    -g 'daemon off; master_process on;' >"$T/nginx/stdout.log" 2>&1 &
PIDS+=($!)
NGINX_PID=$!
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
# Every session the script keeps (IDS, in order of creation), with its replica (OWNER: an index,
# none or many), its length (NPAST) and, for a fork's copy, the routing key its requests send
# (ROUTE, else its own id).
declare -a IDS=() COUNT=(0 0 0)
declare -A OWNER=() NPAST=() ROUTE=()
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
    IDS+=("$id")
    OWNER[$id]=$owner
    NPAST[$id]=5
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
    if [ "$code" = 200 ] && [ "$o" = "${OWNER[topo-0]}" ]; then
        pass "fork: the copy lives on its source's replica and X-Route-Key reaches it"
    else
        fail "fork: decode on the copy $code, held by replica $o (source on ${OWNER[topo-0]})"
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

# ---- 3. draining a replica moves its sessions, which continue bit for bit ---------------------
# README.md's "Moving sessions off a replica (drain)": take the replica out of nginx, export its
# sessions from it directly, PUT them through the proxy (which sends each to its new replica),
# delete them on it, stop it. First, each session of the drained replica and each drain-* session
# elsewhere gets a reference for its next step, computed on an untouched copy: a fork on the
# session's own replica, stepped there and deleted. After the drain the same step through the
# proxy must give the same output, bit for bit, the moved sessions on other replicas and the
# rest where they were.
DRAINED=$((N_REPLICAS - 1))
DRAINED_URL=http://127.0.0.1:${PORTS[$DRAINED]}

# where_held: HELD[id] = the replica whose GET /v1/sessions lists id ("many" if several), over
# the replicas that answer.
declare -A HELD=()
where_held() {
    local r id ids
    HELD=()
    for ((r = 0; r < N_REPLICAS; r++)); do
        [ "$(http GET "http://127.0.0.1:${PORTS[$r]}/v1/sessions")" = 200 ] || continue
        mapfile -t ids < <(grep -o '"session_id":"[^"]*"' "$T/body" | cut -d'"' -f4 || true)
        for id in "${ids[@]}"; do
            if [ -n "${HELD[$id]:-}" ]; then
                HELD[$id]=many
            else
                HELD[$id]=$r
            fi
        done
    done
}
# session_headers ID: the routing headers a client sends with ID's requests, one a line.
session_headers() {
    echo "X-Session-Id: $1"
    [ "${ROUTE[$1]:-$1}" = "$1" ] || echo "X-Route-Key: ${ROUTE[$1]}"
}
# step_body ID I: the JSON of ID's next decode step; I (its index in IDS) picks the token.
step_body() {
    echo "{\"session_id\":\"$1\",\"expect_n_past\":${NPAST[$1]},\"x\":$(x_rows 1 "$((500 + $2))")}"
}

echo "-- drain replica $DRAINED ($N_DRAIN more sessions of 2 to 5 tokens, and a fork on it)"
n_made=0
for ((s = 0; s < N_DRAIN; s++)); do
    id="drain-$s"
    n=$((2 + s % 4))
    code=$(http POST "$PROXY/v1/attend" "{\"session_id\":\"$id\",\"x\":$(x_rows "$n" "$((300 + s))")}" \
        "X-Session-Id: $id")
    if [ "$code" = 200 ] && [ "$(json_int n_tokens)" = "$n" ]; then
        IDS+=("$id")
        NPAST[$id]=$n
        n_made=$((n_made + 1))
    else
        fail "drain session $id: prefill $code $(head -c 200 "$T/body")"
    fi
done
where_held
for id in "${IDS[@]}"; do
    [ "${id#drain-}" = "$id" ] || OWNER[$id]=${HELD[$id]:-none}
done
[ $n_made = "$N_DRAIN" ] && pass "$n_made/$N_DRAIN more sessions made through the proxy"
# A fork's copy on the drained replica must move to where its source goes: its PUT sends the
# source's id as X-Route-Key, as its requests do.
src=""
for id in "${IDS[@]}"; do
    [ "${OWNER[$id]}" = "$DRAINED" ] && { src=$id; break; }
done
if [ -n "$src" ]; then
    child="$src.copy"
    code=$(http POST "$PROXY/v1/sessions/$src/fork" "{\"new_id\":\"$child\"}")
    if [ "$code" = 201 ] && [ "$(owner_of "$child")" = "$DRAINED" ]; then
        IDS+=("$child")
        OWNER[$child]=$DRAINED
        NPAST[$child]=${NPAST[$src]}
        ROUTE[$child]=$src
    else
        fail "fork of $src on the drained replica: $code $(head -c 200 "$T/body")"
    fi
fi

declare -A REF=()
n_ref=0 n_want=0
for ((i = 0; i < ${#IDS[@]}; i++)); do
    id=${IDS[i]}
    case ${OWNER[$id]} in none | many) continue ;; esac
    [ "${OWNER[$id]}" = "$DRAINED" ] || [ "${id#drain-}" != "$id" ] || continue
    n_want=$((n_want + 1))
    url=http://127.0.0.1:${PORTS[${OWNER[$id]}]}
    code=$(http POST "$url/v1/sessions/$id/fork" "{\"new_id\":\"$id.ref\"}")
    [ "$code" = 201 ] || { fail "reference fork of $id: $code $(head -c 200 "$T/body")"; continue; }
    code=$(http POST "$url/v1/attend" "$(step_body "$id" "$i" | sed "s/\"$id\"/\"$id.ref\"/")")
    if [ "$code" = 200 ] && [ -n "$(json_output)" ]; then
        REF[$id]=$(json_output)
        n_ref=$((n_ref + 1))
    else
        fail "reference step of $id: $code $(head -c 200 "$T/body")"
    fi
    [ "$(http DELETE "$url/v1/sessions/$id.ref")" = 204 ] || fail "DELETE $id.ref: $(cat "$T/body")"
done
[ $n_ref = $n_want ] && pass "reference steps on untouched forks: $n_ref/$n_want sessions"

# 1. Out of the proxy: its server lines go from both upstreams, and nginx reloads. Once the old
# workers have exited, no request reaches the drained replica: its sessions hold still.
conf=$T/nginx/attnd.conf
n_lines=$(grep -c "server 127\.0\.0\.1:${PORTS[$DRAINED]} " "$conf" || true)
sed -i "/server 127\.0\.0\.1:${PORTS[$DRAINED]} /d" "$conf"
old_workers=$(ps -o pid= --ppid "$NGINX_PID" | tr -s ' \n' ' ' || true)
reloaded=0
if nginx_ctl -t >"$T/nginx/configtest.log" 2>&1 && nginx_ctl -s reload >"$T/nginx/reload.log" 2>&1; then
    for ((i = 0; i < 100; i++)); do
        alive=0
        for p in $old_workers; do
            kill -0 "$p" 2>/dev/null && alive=1
        done
        if [ $alive = 0 ] && [ -n "$(ps -o pid= --ppid "$NGINX_PID")" ]; then
            reloaded=1
            break
        fi
        sleep 0.1
    done
fi
expect "$reloaded$n_lines = 12" "nginx reloaded without replica $DRAINED in its 2 upstreams" \
    "nginx reload without replica $DRAINED: reloaded=$reloaded, $n_lines server lines removed: $(cat "$T/nginx/configtest.log" "$T/nginx/reload.log")"

# Meanwhile a session's request reaches its new replica, which does not hold it yet: with
# expect_n_past it is refused there, and it leaves nothing behind that would block the PUT.
if [ -n "$src" ]; then
    mapfile -t hdrs < <(session_headers "$src")
    code=$(http POST "$PROXY/v1/attend" "$(step_body "$src" 0)" "${hdrs[@]}")
    if [ "$code" = 409 ] && grep -q '"code":"n_past_mismatch"' "$T/body"; then
        pass "before its PUT, a moving session's step gets 409 n_past_mismatch on its new replica"
    else
        fail "a moving session's step before its PUT: $code $(head -c 200 "$T/body")"
    fi
fi

# 2. Its sessions, listed and exported on the replica itself.
code=$(http GET "$DRAINED_URL/v1/sessions")
listed=$(grep -o '"session_id":"[^"]*"' "$T/body" | cut -d'"' -f4 | sort | tr '\n' ' ' || true)
held=$(for id in "${IDS[@]}"; do [ "${OWNER[$id]}" = "$DRAINED" ] && echo "$id"; done | sort | tr '\n' ' ' || true)
n_held=$(echo "$held" | wc -w)
if [ "$code" = 200 ] && [ "$listed" = "$held" ]; then
    pass "replica $DRAINED lists the $n_held sessions it holds"
else
    fail "replica $DRAINED's GET /v1/sessions: $code, lists [$listed], holds [$held]"
fi
mkdir -p "$T/drain"
declare -A MOVED=()
n_moved=0 n_ok=0
for id in $listed; do
    MOVED[$id]=1
    n_moved=$((n_moved + 1))
    code=$(http GET "$DRAINED_URL/v1/sessions/$id/export")
    if [ "$code" = 200 ] && grep -qi '^content-type: application/octet-stream' "$T/headers"; then
        cp "$T/body" "$T/drain/$id.session"
    else
        fail "export of $id: $code $(head -c 200 "$T/body")"
        continue
    fi
    # 3. Each PUT through the proxy: routed by its path (a copy by its X-Route-Key), as its
    # requests will be.
    hdrs=()
    [ "${ROUTE[$id]:-$id}" = "$id" ] || hdrs=("X-Route-Key: ${ROUTE[$id]}")
    code=$(put_file "$PROXY/v1/sessions/$id" "$T/drain/$id.session" "${hdrs[@]}")
    if [ "$code" = 201 ] && [ "$(json_int n_tokens)" = "${NPAST[$id]}" ]; then
        n_ok=$((n_ok + 1))
    else
        fail "PUT $id through the proxy: $code $(head -c 200 "$T/body")"
    fi
done
expect "$n_ok = $n_moved" "$n_ok/$n_moved sessions exported from replica $DRAINED and PUT through the proxy (201)" \
    "only $n_ok of $n_moved sessions exported and PUT"

# 4. Deleted on the drained replica (with --state-dir, its SIGTERM would write them), then stopped.
n_ok=0
for id in $listed; do
    if [ "$(http DELETE "$DRAINED_URL/v1/sessions/$id")" = 204 ]; then
        n_ok=$((n_ok + 1))
    fi
done
http GET "$DRAINED_URL/v1/sessions" >/dev/null
n_left=$(grep -c '"session_id":' "$T/body" || true)
expect "$n_ok$n_left = ${n_moved}0" "moved sessions deleted on replica $DRAINED (204), none left there" \
    "$n_ok/$n_moved deleted on replica $DRAINED, $n_left left there"
kill -TERM "${REPLICA_PID[$DRAINED]}"
status=0
wait "${REPLICA_PID[$DRAINED]}" || status=$?
expect "$status = 0" "drained replica $DRAINED exited 0 on SIGTERM" \
    "drained replica $DRAINED exited $status on SIGTERM"

# Every session is held by one live replica: a moved one by another than the drained replica (a
# copy beside its source), the others by the same as before.
where_held
n_placed=0 n_all=0
declare -a MOVED_TO=(0 0 0)
for id in "${IDS[@]}"; do
    was=${OWNER[$id]}
    case $was in none | many) continue ;; esac
    n_all=$((n_all + 1))
    o=${HELD[$id]:-none}
    if [ "$was" = "$DRAINED" ]; then
        if [ "$o" != none ] && [ "$o" != many ] && [ "$o" != "$DRAINED" ] &&
            { [ -z "${ROUTE[$id]:-}" ] || [ "$o" = "${HELD[${ROUTE[$id]}]:-}" ]; }; then
            n_placed=$((n_placed + 1))
            MOVED_TO[o]=$((MOVED_TO[o] + 1))
        else
            fail "moved session $id is held by replica $o${ROUTE[$id]:+ (its source by ${HELD[${ROUTE[$id]}]:-none})}"
        fi
    elif [ "$o" = "$was" ]; then
        n_placed=$((n_placed + 1))
    else
        fail "session $id was on replica $was, is now held by $o"
    fi
    OWNER[$id]=$o
done
expect "$n_placed = $n_all" \
    "all $n_all sessions held once: the moved ones by replicas 0/1 (${MOVED_TO[0]}/${MOVED_TO[1]}), the rest where they were" \
    "only $n_placed of $n_all sessions held where they should be"

# Each session's next step through the proxy: the reference's output, bit for bit.
n_moved_ok=0 n_moved=0 n_stay=0 n_stay_ok=0
for ((i = 0; i < ${#IDS[@]}; i++)); do
    id=${IDS[i]}
    [ -n "${REF[$id]:-}" ] || continue
    mapfile -t hdrs < <(session_headers "$id")
    code=$(http POST "$PROXY/v1/attend" "$(step_body "$id" "$i")" "${hdrs[@]}")
    got_past=$(json_int n_past)
    out=$(json_output)
    why=""
    if [ "$code" != 200 ] || [ "$got_past" != "${NPAST[$id]}" ]; then
        why="$code, n_past $got_past (want ${NPAST[$id]}): $(head -c 200 "$T/body")"
    elif [ "$out" != "${REF[$id]}" ]; then
        why="output differs from the reference: $(echo "$out" | cut -c1-80) vs $(echo "${REF[$id]}" | cut -c1-80)"
    fi
    if [ -n "${MOVED[$id]:-}" ]; then
        n_moved=$((n_moved + 1))
        [ -z "$why" ] && n_moved_ok=$((n_moved_ok + 1))
    else
        n_stay=$((n_stay + 1))
        [ -z "$why" ] && n_stay_ok=$((n_stay_ok + 1))
    fi
    [ -z "$why" ] || fail "after the drain, session $id: $why"
    NPAST[$id]=$((NPAST[$id] + 1))
done
expect "$n_moved_ok = $n_moved" \
    "moved sessions: $n_moved_ok/$n_moved take their next step through the proxy, output bit for bit the reference" \
    "moved sessions: only $n_moved_ok of $n_moved continue correctly"
expect "$n_stay_ok = $n_stay" \
    "other drain-* sessions: $n_stay_ok/$n_stay unaffected, output bit for bit the reference" \
    "other drain-* sessions: only $n_stay_ok of $n_stay unaffected"
n_5xx=$(grep -cE '" 5[0-9][0-9] ' "$T/nginx/logs/access.log" || true)
n_req=$(wc -l <"$T/nginx/logs/access.log")
expect "$n_5xx = 0" "no 5xx through the proxy so far ($n_req requests)" \
    "$n_5xx of $n_req requests through the proxy got a 5xx: $(grep -E '" 5[0-9][0-9] ' "$T/nginx/logs/access.log" | head -3)"
COUNT=(0 0 0)
for id in "${IDS[@]}"; do
    o=${OWNER[$id]}
    case $o in none | many) ;; *) COUNT[o]=$((COUNT[o] + 1)) ;; esac
done

# ---- 4. a dead replica fails its own sessions only -------------------------------------------
VICTIM=0
echo "-- kill replica $VICTIM (SIGTERM; it holds ${COUNT[$VICTIM]} sessions)"
kill -TERM "${REPLICA_PID[$VICTIM]}"
status=0
wait "${REPLICA_PID[$VICTIM]}" || status=$?
expect "$status = 0" "replica $VICTIM drained and exited 0 on SIGTERM" \
    "replica $VICTIM exited $status on SIGTERM"

n_dead_ok=0 n_live_ok=0 n_dead=0 n_live=0
for ((i = 0; i < ${#IDS[@]}; i++)); do
    id=${IDS[i]}
    owner=${OWNER[$id]}
    case $owner in none | many) continue ;; esac
    mapfile -t hdrs < <(session_headers "$id")
    code=$(http POST "$PROXY/v1/attend" \
        "{\"session_id\":\"$id\",\"expect_n_past\":${NPAST[$id]},\"x\":$(x_rows 1 "$((i + 5))")}" "${hdrs[@]}")
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
        if [ "$code" = 200 ] && [ "$(json_int n_past)" = "${NPAST[$id]}" ]; then
            n_live_ok=$((n_live_ok + 1))
        else
            fail "session $id on a live replica: $code $(head -c 200 "$T/body")"
        fi
    fi
done
[ $n_dead_ok = $n_dead ] && pass "dead replica's sessions: $n_dead_ok/$n_dead got JSON 502 replica_unavailable"
[ $n_live_ok = $n_live ] && pass "live replicas' sessions: $n_live_ok/$n_live decoded on (expect_n_past held)"

# The dead replica's sessions were not quietly re-created elsewhere.
n_leaked=0
for id in "${IDS[@]}"; do
    [ "${OWNER[$id]}" = $VICTIM ] || continue
    o=$(owner_of "$id")
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
    { [ $r = $VICTIM ] || [ $r = "$DRAINED" ]; } && continue
    kill -TERM "${REPLICA_PID[$r]}"
    status=0
    wait "${REPLICA_PID[$r]}" || status=$?
    [ $status = 0 ] && n_ok=$((n_ok + 1))
done
expect "$n_ok = $((N_REPLICAS - 2))" "the other replicas exited 0 on SIGTERM" \
    "only $n_ok of $((N_REPLICAS - 2)) other replicas exited 0 on SIGTERM"

echo "== topology: $N_PASS passed, $N_FAIL failed"
if [ $N_FAIL -gt 0 ]; then
    for f in "$T"/attnd*.log "$T/nginx/logs/error.log"; do
        echo "--- tail $f"
        tail -5 "$f"
    done
    exit 1
fi
