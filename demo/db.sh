#!/usr/bin/env bash
# make demo-db: idemproxy and a Python worker that pays wins into PostgreSQL
# through the inbox-and-fence helper; then Redis forgets (restarted from a
# snapshot taken before the work), idemproxy delivers every win again, and the
# database still holds each payout once. Runs beside a throwaway PostgreSQL
# (tests/with-postgres).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${IDEMPROXY_TEST_PG:-}" ] || exec tests/with-postgres "$0" "$@"
tmp=$(mktemp -d /tmp/idemproxy-demo-db.XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
cli() { redis-cli -p "$port" "$@"; }
sql() { psql -qAt "$IDEMPROXY_TEST_PG" -c "$1"; }
redis() {
    redis-server --port "$port" --bind 127.0.0.1 --dir "$tmp" --save "" >/dev/null &
    pids+=($!); redis_pid=$!
    until cli ping >/dev/null 2>&1; do sleep 0.05; done
}

echo "== PostgreSQL: the inbox and fence tables (sql/postgresql/001_idemproxy_inbox.sql) and a payouts table"
psql -q "$IDEMPROXY_TEST_PG" -f sql/postgresql/001_idemproxy_inbox.sql
sql "CREATE TABLE payouts (event_id text NOT NULL, amount int NOT NULL)"   # no unique key: the inbox is the guard
export DEMO_PG=$IDEMPROXY_TEST_PG

echo "== redis-server on 127.0.0.1:$port; 5 wins published, then a snapshot (SAVE)"
redis
cli XGROUP CREATE wins payouts 0 MKSTREAM >/dev/null
for i in 1 2 3 4 5; do
    cli XADD wins '*' payload "{\"eventId\":\"win-$i\",\"amount\":$((i * 10))}" >/dev/null
done
cli SAVE >/dev/null

export DEMO_REDIS_URL="redis://127.0.0.1:$port" DEMO_ENDPOINT="ipc://$tmp/app.sock"
export DEMO_METRICS_LISTEN="127.0.0.1:$(free_port)"
echo "== worker (demo/db_worker.py: 10 lines around Inbox.handler) and idemproxy -c demo/idemproxy-db.yaml"
clients/python/.venv/bin/python demo/db_worker.py "$DEMO_ENDPOINT" > "$tmp/worker.out" 2>&1 &
pids+=($!)
tail -f --pid=$$ "$tmp/worker.out" | sed -u "s/^/   worker: /" &
pids+=($!)
build/idemproxy -c demo/idemproxy-db.yaml &
pids+=($!)
for _ in $(seq 400); do [ "$(cli --scan --pattern 'idem:*' | wc -l)" -ge 5 ] && [ "$(sql 'SELECT count(*) FROM payouts')" -ge 5 ] && break; sleep 0.05; done
sleep 0.5
echo "   payouts rows: $(sql 'SELECT count(*) FROM payouts'); done marks in Redis: $(cli --scan --pattern 'idem:*' | wc -l)"

echo "== Redis forgets: killed, restarted from the snapshot (the wins unread, no done marks)"
kill -9 "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
redis
metric() { curl -s "http://$DEMO_METRICS_LISTEN/metrics" | awk -v m="$1" '$1 ~ "^"m"[{]" {s += $2} END {print s+0}'; }
for _ in $(seq 600); do [ "$(metric idemproxy_deliveries_total)" -ge 10 ] && [ "$(cli XPENDING wins payouts | head -1)" = 0 ] && break; sleep 0.05; done
sleep 0.5
echo
echo "== result: idemproxy delivered $(metric idemproxy_deliveries_total) times (Redis forgot 5 done marks),"
echo "   the inbox answered the 5 repeats without running the handler:"
sql "SELECT event_id || ' paid ' || count(*) || ' time(s), ' || sum(amount) FROM payouts GROUP BY event_id ORDER BY event_id" | sed 's/^/   /'
