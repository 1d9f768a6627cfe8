#!/usr/bin/env bash
# make demo: a local redis-server, idemproxy, the C example worker and a
# producer that publishes RouletteSpinEvent / MiniGameFinishedEvent copies.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d /tmp/idemproxy-demo.XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

cli() { redis-cli -p "$port" "$@"; }
# No summary from a daemon that did not run.
alive() {
    kill -0 "$1" 2>/dev/null && return
    local rc=0
    wait "$1" || rc=$?
    echo "== idemproxy exited (status $rc); its error is above" >&2
    exit 1
}

echo "== redis-server on 127.0.0.1:$port (data in $tmp)"
redis-server --port "$port" --bind 127.0.0.1 --dir "$tmp" --save "" >/dev/null &
pids+=($!)
until cli ping >/dev/null 2>&1; do sleep 0.05; done

# Free ports for Redis and for the metrics server: 9464 is often taken (OpenTelemetry's default).
export DEMO_REDIS_URL="redis://127.0.0.1:$port" DEMO_ENDPOINT="ipc://$tmp/app.sock"
export DEMO_METRICS_LISTEN="127.0.0.1:$(free_port)"
echo "== example worker (clients/c), started first: it dials until idemproxy is there"
clients/c/build/example_worker --endpoint "$DEMO_ENDPOINT" > "$tmp/worker.out" &
pids+=($!)
tail -f --pid=$$ "$tmp/worker.out" | sed -u "s/^/   worker handled: /" &
pids+=($!)

echo "== producer: 12 events, published with copies (at-least-once, like a retrying publisher)"
n=0
for i in 1 2 3 4 5 6; do
    for copy in $(seq 1 $(( (i % 3) + 1 ))); do
        type=RouletteSpinEvent; [ $((i % 2)) = 0 ] && type=MiniGameFinishedEvent
        cli XADD room '*' payload "{\"eventId\":\"evt-$i\",\"type\":\"$type\",\"joinCode\":\"A1B2\"}" >/dev/null
        n=$((n + 1))
    done
done
echo "   published $n entries for 6 eventIds"

echo "== idemproxy -c demo/idemproxy.yaml"
build/idemproxy -c demo/idemproxy.yaml &
proxy=$!
pids+=($proxy)
for _ in $(seq 400); do [ "$(wc -l < "$tmp/worker.out")" -ge 6 ] && break; sleep 0.05; done
sleep 0.5
alive "$proxy"
echo "   the worker handled $(wc -l < "$tmp/worker.out") events; $((n - $(wc -l < "$tmp/worker.out"))) copies were skipped"

echo "== restart idemproxy: it reads the stream again from \"0\" (seed 000's fromStart())"
kill -TERM "$proxy" 2>/dev/null; wait "$proxy" || true
for i in 1 2; do
    cli XADD room '*' payload "{\"eventId\":\"evt-$i\",\"type\":\"RouletteSpinEvent\",\"joinCode\":\"A1B2\"}" >/dev/null
    n=$((n + 1))
done
cli XADD room '*' payload '{"eventId":"evt-7","type":"RouletteSpinEvent","joinCode":"C3D4"}' >/dev/null
n=$((n + 1))
echo "   published 2 more copies of evt-1, evt-2 and one new event evt-7"
build/idemproxy -c demo/idemproxy.yaml &
proxy=$!
pids+=($proxy)
for _ in $(seq 400); do [ "$(wc -l < "$tmp/worker.out")" -ge 7 ] && break; sleep 0.05; done
sleep 1
alive "$proxy"
handled=$(wc -l < "$tmp/worker.out")
echo
echo "== result: $n entries in the stream, $handled handled once each, $((n - handled)) copies skipped"
echo "   done keys in Redis: $(cli --scan --pattern 'done:*' | sort | tr '\n' ' ')"
