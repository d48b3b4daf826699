#!/bin/bash
# Streams a generated Criteo data set of about 5 GB (never committed: generate_data writes it at
# run time) through a 2 pserver x 2 trainer sync cluster with --reader=stream, and reports each
# trainer's peak RSS (VmHWM, sampled every second), the data size and the samples/s.
#
#   bazel build -c opt //deploy/launch:tessera_launch //pserver:tessera_pserver \
#     //trainer:tessera_trainer //examples/ctr:generate_data
#   tests/bench/stream_5gb.sh [FILES (21)] [LINES_PER_FILE (500000)]
#
# Needs about 2x the data size free under ${TMPDIR:-/tmp}: the data and nothing else; everything
# is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
FILES="${1:-21}"
LINES="${2:-500000}"
BIN=bazel-bin
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tessera-stream-5gb.XXXXXX")"
LAUNCHER=""
cleanup() {
  if [ -n "$LAUNCHER" ]; then kill "$LAUNCHER" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

mkdir -p "$WORK/data"
start=$(date +%s)
for ((i = 0; i < FILES; i += 2)); do
  for j in $i $((i + 1)); do
    [ "$j" -lt "$FILES" ] || continue
    "$BIN/examples/ctr/generate_data" --out="$WORK/data/part-$(printf %03d "$j").txt" \
      --examples="$LINES" --seed=$((j + 1)) --vocab_per_slot=100000 >/dev/null &
  done
  wait
done
bytes=$(du -sb "$WORK/data" | cut -f1)
echo "generated $FILES files, $((FILES * LINES)) lines, $bytes bytes in $(($(date +%s) - start)) s"

"$BIN/deploy/launch/tessera_launch" --pservers=2 --trainers=2 --example=ctr \
  --train_data="$WORK/data" --reader=stream --shuffle_buffer=10000 --reader_queue=8192 \
  --batch_size=1024 --epochs=1 --log_every_steps=0 --log_dir="$WORK/logs" --noplot \
  >"$WORK/launch.out" 2>&1 &
LAUNCHER=$!
start=$(date +%s)
declare -A peak
while kill -0 "$LAUNCHER" 2>/dev/null; do
  for pid in $(pgrep -P "$LAUNCHER" -f tessera_trainer || true); do
    hwm=$(awk '/^VmHWM:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
    if [ -n "$hwm" ] && [ "$hwm" -gt "${peak[$pid]:-0}" ]; then peak[$pid]=$hwm; fi
  done
  sleep 1
done
status=0
wait "$LAUNCHER" || status=$?
LAUNCHER=""
wall=$(($(date +%s) - start))
if [ "$status" -ne 0 ]; then
  echo "the job failed (exit $status):" >&2
  tail -20 "$WORK/launch.out" >&2
  exit 1
fi
for pid in "${!peak[@]}"; do
  echo "trainer pid $pid: peak RSS $((peak[$pid] / 1024)) MB"
done
grep -h "epoch 0 mean loss" "$WORK"/logs/trainer.*.log || true
samples=$(cat "$WORK"/logs/trainer.*.log | grep -oE "epoch 0 mean loss [^ ]+ samples [0-9]+" |
  awk '{ s += $NF } END { print s }')
echo "trained $samples samples in ${wall} s wall: $((samples / (wall > 0 ? wall : 1))) samples/s"
