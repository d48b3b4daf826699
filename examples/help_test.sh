#!/usr/bin/env bash
# The example binaries' --help: exit status 0, the usage line, and every flag of the binary
# with its meaning and default (not Abseil's "No flags matched"); a bad flag still fails.
set -uo pipefail
ROOT="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
# shellcheck source=tests/cli_test_lib.sh
source "$ROOT/tests/cli_test_lib.sh"

# help BINARY USAGE_TEXT FLAG...: --help exits 0 and lists each FLAG with a default.
help() {
  local bin="$ROOT/$1" usage=$2
  shift 2
  "$bin" --help >"$TMP/stdout" 2>"$TMP/stderr"
  local rc=$?
  [ "$rc" = 0 ] || fail "$1 --help: exit status $rc"
  grep -qF -- "$usage" "$TMP/stdout" || fail "$1 --help lacks '$usage'"
  grep -q "No flags matched" "$TMP/stdout" && fail "$1 --help: No flags matched"
  for flag in "$@"; do
    grep -qE -- "--$flag \(.+\); *$|--$flag \(" "$TMP/stdout" || fail "$1 --help lacks --$flag"
  done
  [ "$(grep -c "default:" "$TMP/stdout")" -ge "$#" ] || fail "$1 --help: flags without defaults"
  "$bin" --no_such_flag >/dev/null 2>&1 && fail "$1 --no_such_flag: exit status 0"
}

help examples/ctr/ctr "ctr: trains a click model" batch_size epochs model optimizer seed
help examples/mlp_regression/mlp_regression "mlp_regression" batch_size epochs program
help examples/fashion_mnist_mlp/fashion_mnist_mlp "784-256-10 MLP on Fashion-MNIST" batch_size \
  epochs lr train_data test_data target_accuracy
help examples/lenet/lenet "LeNet CNN on Fashion-MNIST" batch_size epochs lr train_data
finish
