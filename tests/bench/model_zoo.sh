#!/usr/bin/env bash
# Held-out AUC and throughput of the Python-authored models (examples/python: wide&deep, DeepFM,
# DCN, and the multi-hot model) trained by the stock daemons: tessera_launch --model on
# 2 pservers x 2 trainers with every table on the pservers, sync and async, on the same
# Criteo-format data from generate_data (the planted model's AUC, the ceiling, is printed too).
#
#   bazel build //deploy/launch:tessera_launch //pserver:tessera_pserver \
#     //trainer:tessera_trainer //examples/ctr:generate_data
#   tests/bench/model_zoo.sh [TRAIN_EXAMPLES (default 100000)] [EPOCHS (default 1)]
#
# Prints one table row per (model, mode): AUC, log loss, samples/s of trainer 0, wall seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."
N="${1:-100000}"
EPOCHS="${2:-1}"
BIN=bazel-bin
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tessera-zoo.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH=python

"$BIN/examples/ctr/generate_data" --out="$WORK/train.txt" --examples="$N" --vocab_per_slot=100000 \
  --seed=1 --model_seed=7 --multi_hot_slots=2 >/dev/null
"$BIN/examples/ctr/generate_data" --out="$WORK/test.txt" --examples=$((N / 5)) \
  --vocab_per_slot=100000 --seed=2 --model_seed=7 --multi_hot_slots=2 >/dev/null
# The files carry 2 multi-hot columns; models without multi-hot feeds read only the first 39
# fields, so they get a copy without them.
cut -f1-40 "$WORK/train.txt" >"$WORK/train39.txt"
cut -f1-40 "$WORK/test.txt" >"$WORK/test39.txt"

/usr/bin/python3 examples/python/wide_deep.py --out="$WORK/wide_deep.pbtxt" --distributed_tables
/usr/bin/python3 examples/python/deepfm.py --out="$WORK/deepfm.pbtxt" --distributed_tables
/usr/bin/python3 examples/python/dcn.py --out="$WORK/dcn.pbtxt" --distributed_tables
/usr/bin/python3 examples/python/multi_hot.py --out="$WORK/multi_hot.pbtxt" --distributed_tables

echo "| model | mode | held-out AUC | log loss | samples/s (trainer 0) | wall s |"
echo "| --- | --- | ---: | ---: | ---: | ---: |"
for model in wide_deep deepfm dcn multi_hot; do
  data=39
  [ "$model" = multi_hot ] && data=""
  for sync in true false; do
    log="$WORK/${model}_$sync"
    start=$(date +%s.%N)
    "$BIN/deploy/launch/tessera_launch" --pservers=2 --trainers=2 --model="$WORK/$model.pbtxt" \
      --train_data="$WORK/train$data.txt" --test_data="$WORK/test$data.txt" --sync_mode=$sync \
      --epochs="$EPOCHS" --batch_size=512 --log_every_steps=50 --log_dir="$log" --noplot \
      >"$log.out" 2>&1 || { echo "$model sync=$sync failed:"; tail -5 "$log.out"; exit 1; }
    wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
    t0="$log/trainer.0.log"
    auc=$(grep -oiE "auc [0-9.]+" "$t0" | tail -1 | cut -d' ' -f2)
    loss=$(grep -oE "held-out loss [0-9.]+" "$t0" | tail -1 | cut -d' ' -f3)
    sps=$(grep -oE "samples/s [0-9.]+" "$t0" | tail -1 | cut -d' ' -f2)
    printf "| %s | %s | %.4f | %.4f | %s | %.1f |\n" "$model" \
      "$([ $sync = true ] && echo sync || echo async)" "$auc" "$loss" "${sps:-?}" "$wall"
  done
done
