#!/usr/bin/env bash
# The built-in model files the daemons compile in (cluster/builtin_models/*.pbtxt) are exactly
# what the examples' C++ builders write; after changing a builder, run
# examples/update_builtin_models.sh.
set -uo pipefail

ROOT="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}"
BIN="$ROOT/examples/tessera_program"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
status=0
for example in ctr mlp_regression fashion_mnist_mlp lenet; do
  if ! "$BIN" --example=$example --model_out="$TMP/$example.pbtxt" >"$TMP/out" 2>&1; then
    echo "FAIL: tessera_program --example=$example: $(cat "$TMP/out")"
    status=1
    continue
  fi
  if ! diff -q "$ROOT/cluster/builtin_models/$example.pbtxt" "$TMP/$example.pbtxt" >/dev/null; then
    echo "FAIL: cluster/builtin_models/$example.pbtxt differs from what the $example builder" \
      "writes; run examples/update_builtin_models.sh"
    diff "$ROOT/cluster/builtin_models/$example.pbtxt" "$TMP/$example.pbtxt" | head -20
    status=1
  fi
done
[ "$status" = 0 ] && echo "PASS: built-in model files match the builders"
exit "$status"
