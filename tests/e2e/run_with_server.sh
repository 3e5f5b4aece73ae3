#!/usr/bin/env bash
# Starts `clef serve` on a free loopback port, waits until it is ready, runs a Node.js test script against it with
# TYPESAFE_BASE_URL / TYPESAFE_API_KEY set, then stops the server with SIGTERM and checks it exits 0.
# Usage: run_with_server.sh CLEF_BINARY MODEL_DIR NODE_MODULES_DIR SCRIPT.mjs [extra clef serve args...]
# The scripts read the fixture from CLEF_TEST_DATA_DIR (default: the model's parent directory).
set -euo pipefail
clef=$1 model=$2 modules=$3 script=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)

# The official client, pinned, installed from the npm registry by name (once per build tree).
if [ ! -f "$modules/node_modules/@typesafe-ai/sdk/package.json" ]; then
  mkdir -p "$modules"
  npm install --silent --no-audit --no-fund --no-save --prefix "$modules" @typesafe-ai/sdk@0.6.0 >/dev/null
fi

log=$(mktemp)
"$clef" serve --model "$model" --port 0 --name tiny-clef --alias clef-flash --api-key e2e-test-key "$@" 2>"$log" &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; rm -f "$log"; }
trap cleanup EXIT

port=""
for _ in $(seq 1 300); do
  port=$(sed -n 's/.*on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -n1)
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "server exited early"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { cat "$log"; echo "server did not report its port"; exit 1; }
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break
  sleep 0.1
done

status=0
NODE_PATH="$modules/node_modules" TYPESAFE_BASE_URL="http://127.0.0.1:$port" TYPESAFE_API_KEY=e2e-test-key \
  CLEF_TEST_DATA="${CLEF_TEST_DATA_DIR:-$(dirname "$model")}" CLEF_SERVER_PID="$pid" node --test "$here/$script" ||
  status=$?

kill -TERM "$pid"
server_status=0
wait "$pid" || server_status=$?
trap - EXIT
if [ "$server_status" -ne 0 ]; then
  tail -n 60 "$log"  # e.g. a sanitizer report
  rm -f "$log"
  echo "clef serve exited with $server_status after SIGTERM"
  exit 1
fi
rm -f "$log"
exit "$status"
