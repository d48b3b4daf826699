#!/usr/bin/env bash
# DeepFM and DCN, written only with python/tessera (examples/python/), train through the stock
# daemons: tessera_launch --model=... on 2 pservers x 2 trainers, every table on the pservers,
# in sync and in async mode, on Criteo-format data from generate_data. Each job must exit 0 and
# reach a held-out AUC above chance. (tests/bench/model_zoo.sh measures them at a larger size.)
set -uo pipefail
ROOT="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
# shellcheck source=tests/cli_test_lib.sh
source "$ROOT/tests/cli_test_lib.sh"

for split in train:1 test:2; do
  "$ROOT/examples/ctr/generate_data" --out="$TMP/${split%%:*}.txt" --examples=8000 \
    --vocab_per_slot=500 --seed="${split##*:}" --model_seed=7 >/dev/null ||
    fail "generate_data ${split%%:*}"
done
export PYTHONPATH="$ROOT/python"
# Small deep parts and a higher learning rate than the examples' defaults: ~60 steps per trainer.
for name in deepfm dcn; do
  timeout 60 /usr/bin/python3 "$ROOT/examples/python/$name.py" --out="$TMP/$name.pbtxt" \
    --distributed_tables --hidden=64,32 --learning_rate=0.01 ||
    fail "$name.py did not write its model file"
  grep -q "is_distributed: true" "$TMP/$name.pbtxt" || fail "$name: no distributed table"
  for sync in true false; do
    timeout 240 "$ROOT/deploy/launch/tessera_launch" --pserver_bin="$ROOT/pserver/tessera_pserver" \
      --trainer_bin="$ROOT/trainer/tessera_trainer" --pservers=2 --trainers=2 \
      --model="$TMP/$name.pbtxt" --train_data="$TMP/train.txt" --test_data="$TMP/test.txt" \
      --sync_mode=$sync --batch_size=128 --log_dir="$TMP/${name}_$sync" --noplot \
      >"$TMP/${name}_$sync.out" 2>&1 ||
      fail "$name --sync_mode=$sync: $(tail -5 "$TMP/${name}_$sync.out")"
    expect_auc_above "$TMP/${name}_$sync/trainer.0.log" 0.65
  done
done
finish
