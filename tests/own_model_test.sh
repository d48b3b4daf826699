#!/usr/bin/env bash
# README's "Train your own model", start to finish: the my_model.py shown there (it must be
# examples/python/my_model.py verbatim) writes a model file; the single-machine runner trains it;
# tessera_launch trains it on 2 pservers x 2 trainers, in sync and in async mode. Every step
# must exit 0 and report a held-out AUC above chance.
set -uo pipefail
ROOT="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
# shellcheck source=tests/cli_test_lib.sh
source "$ROOT/tests/cli_test_lib.sh"

# The README's code block after the "my_model.py" marker is the example file.
sed -n '/^<!-- my_model.py -->$/,/^```$/p' "$ROOT/README.md" | sed '1,2d;$d' >"$TMP/readme_model.py"
[ -s "$TMP/readme_model.py" ] || fail "README.md has no my_model.py block"
diff -u "$ROOT/examples/python/my_model.py" "$TMP/readme_model.py" >/dev/null ||
  fail "README.md's my_model.py differs from examples/python/my_model.py"

MODEL="$TMP/my_model.pbtxt"
PYTHONPATH="$ROOT/python" timeout 60 /usr/bin/python3 "$ROOT/examples/python/my_model.py" \
  "$MODEL" || fail "my_model.py did not write the model file"

timeout 120 "$ROOT/examples/ctr/ctr" --model="$MODEL" --train_samples=8000 --test_samples=2000 \
  --log_every_steps=0 >"$TMP/single.log" 2>&1 || fail "single machine: $(tail -3 "$TMP/single.log")"
expect_auc_above "$TMP/single.log" 0.6

for sync in true false; do
  timeout 240 "$ROOT/deploy/launch/tessera_launch" --pserver_bin="$ROOT/pserver/tessera_pserver" \
    --trainer_bin="$ROOT/trainer/tessera_trainer" --pservers=2 --trainers=2 --model="$MODEL" \
    --sync_mode=$sync --num_examples=8000 --num_test_examples=2000 --batch_size=128 \
    --log_dir="$TMP/job_$sync" --noplot >"$TMP/launch_$sync.log" 2>&1 ||
    fail "tessera_launch --sync_mode=$sync: $(tail -5 "$TMP/launch_$sync.log")"
  expect_auc_above "$TMP/job_$sync/trainer.0.log" 0.6
done
finish
