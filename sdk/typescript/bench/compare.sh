#!/usr/bin/env bash
# Compares the TypeScript SDK's publish rate with the Go SDK's on one ledger:
# rounds of the Go SDK's bench worker (ledgerlab bench worker) and this
# package's bench/publish.js alternate on a fresh ledgerctl dev, each
# publishing EVENTS events over TASKS tasks at full speed. Prints one JSON
# line per run and the TypeScript/Go ratio of the median rates.
#   npm run build && npx tsc -p tsconfig.test.json && node scripts/build-ledgerctl.mjs
#   (cd ../.. && go build -o sdk/typescript/build-test/ledgerlab ./cmd/ledgerlab)
#   bench/compare.sh [rounds] [events] [tasks]
# SDK_BATCH sets both SDKs' events per batch message (1: each alone; default theirs, 256).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3} events=${2:-30000} tasks=${3:-64}
ledgerctl=${LEDGERCTL:-build-test/ledgerctl}
ledgerlab=${LEDGERLAB:-build-test/ledgerlab}
db=${TEST_DATABASE_URL:-postgres://root@127.0.0.1:5432/test?sslmode=disable}
batch=${SDK_BATCH:-0}

# Every background process is in pids, and the EXIT trap ends them all: a
# stdin feeder left sleeping would hold the caller's pipe open (| tail hangs).
pids=() tmps=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -f "${tmps[@]}"
}
trap cleanup EXIT
# feed opens fd feed_fd on a process that prints $1 (if any) and then keeps
# the pipe open until killed; feed_pid is that process.
feed() {
  if [ -n "${1:-}" ]; then exec {feed_fd}< <(echo "$1"; exec sleep 3600); else exec {feed_fd}< <(exec sleep 3600); fi
  feed_pid=$!
  pids+=("$feed_pid")
}

out=$(mktemp) && tmps+=("$out")
feed
"$ledgerctl" dev -json -nats-port 0 -fresh-database -database-url "$db" -stop-on-stdin-eof \
  <&"$feed_fd" > "$out" 2>/dev/null &
pids+=($!)
exec {feed_fd}<&-
for _ in $(seq 1 100); do [ -s "$out" ] && break; sleep 0.1; done
url=$(node -p "JSON.parse(require('fs').readFileSync('$out','utf8')).nats_url")

go_rates=() ts_rates=()
for r in $(seq 1 "$rounds"); do
  # Each run holds every partition; the next waits out its TTL after release.
  # The bench worker runs until its stdin ends: it is stopped once it is done.
  wout=$(mktemp) && tmps+=("$wout")
  feed go
  "$ledgerlab" bench worker -nats-url "$url" -run "go$r" -events "$events" -tasks "$tasks" -sdk-batch "$batch" <&"$feed_fd" > "$wout" &
  worker=$! wfeed=$feed_pid
  pids+=("$worker")
  exec {feed_fd}<&-
  until grep -q '"done"' "$wout"; do
    kill -0 $worker 2>/dev/null || { echo "compare: the Go bench worker failed" >&2; exit 1; }
    sleep 0.2
  done
  kill "$worker" "$wfeed" 2>/dev/null || true
  line=$(grep '"done"' "$wout")
  rm -f "$wout"
  rate=$(node -p "const d=JSON.parse('$line'); Math.round(d.events/((d.last_receipt_ns-d.first_publish_ns)/1e9))")
  echo "{\"sdk\":\"go\",\"round\":$r,\"rate\":$rate}"
  go_rates+=("$rate")
  sleep 3.5
  line=$(BATCH_MAX=$([ "$batch" = 0 ] || echo "$batch") node build-test/bench/publish.js "$url" "$events" "$tasks" "bench.ts$r" | tail -1)
  echo "$line" | sed "s/^{/{\"sdk\":\"ts\",\"round\":$r,/"
  ts_rates+=("$(node -p "JSON.parse('$line').rate ?? 0")")
  sleep 3.5
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
g=$(median "${go_rates[@]}") t=$(median "${ts_rates[@]}")
echo "{\"go_median\":$g,\"ts_median\":$t,\"ts_over_go\":$(node -p "($t/$g).toFixed(2)")}"
