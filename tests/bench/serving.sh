#!/usr/bin/env bash
# From training to serving on the CTR job: trains the built-in CTR wide&deep (every table on the
# pserver) on Criteo-format files with an inference bundle at the end, then measures
#   1. tessera_predict on the held-out file: examples/s on one thread (one core), and its AUC
#      and loss beside the trainer's own held-out figures;
#   2. a pserver serving the bundle (--serve_bundle): Prefetch requests of 4096 ids of one table,
#      requests/s and latency p50/p99, with 1 and 4 client threads (tests/bench/serve_prefetch).
#
#   bazel build //deploy/launch:tessera_launch //pserver:tessera_pserver \
#     //trainer:tessera_trainer //serving:tessera_predict //tests/bench:serve_prefetch \
#     //examples/ctr:generate_data
#   tests/bench/serving.sh [TRAIN_EXAMPLES (default 60000)] [TEST_EXAMPLES (default 50000)]
set -euo pipefail
cd "$(dirname "$0")/../.."
N="${1:-60000}"
T="${2:-50000}"
BIN=bazel-bin
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tessera-serving.XXXXXX")"
SERVER=""
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN/examples/ctr/generate_data" --out="$WORK/train.txt" --examples="$N" --vocab_per_slot=10000 \
  --seed=1 >/dev/null
"$BIN/examples/ctr/generate_data" --out="$WORK/test.txt" --examples="$T" --vocab_per_slot=10000 \
  --seed=2 >/dev/null

"$BIN/deploy/launch/tessera_launch" --pservers=1 --trainers=1 --example=ctr \
  --train_data="$WORK/train.txt" --test_data="$WORK/test.txt" --epochs=1 \
  --export_dir="$WORK/exports" --log_dir="$WORK/logs" >"$WORK/launch.out" 2>&1 ||
  { cat "$WORK/launch.out"; exit 1; }
echo "trainer:        $(grep -h "held-out loss" "$WORK"/logs/trainer.0.log | tail -1)"

for round in 1 2 3; do
  "$BIN/serving/tessera_predict" --bundle="$WORK/exports" --data="$WORK/test.txt" \
    --out="$WORK/predictions.txt" | sed "s/^/predict run $round: /"
done

PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$BIN/pserver/tessera_pserver" --serve_bundle="$WORK/exports" --pservers="127.0.0.1:$PORT" \
  --current_endpoint="127.0.0.1:$PORT" >"$WORK/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 100); do
  grep -q ": serving .*export-" "$WORK/serve.log" && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/serve.log"; exit 1; }
  sleep 0.1
done
grep ": serving .*export-" "$WORK/serve.log"
# A table of the bundle (the CTR model's first slot's embedding).
TABLE="$(grep -o "table\.[^ ]*\.dim" "$WORK"/exports/export-*/pserver-0-of-1.MANIFEST | head -1 |
  sed 's/^table\.//; s/\.dim$//')"
for c in 1 4; do
  "$BIN/tests/bench/serve_prefetch" --endpoint="127.0.0.1:$PORT" --table="$TABLE" \
    --ids=4096 --seconds=5 --concurrency="$c"
done
