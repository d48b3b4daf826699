#!/usr/bin/env bash
# mlp_regression --program/--startup_program: the built-in programs written by tessera_program
# train exactly like the built-in model; broken copies (malformed text, an unknown op type, a
# parameter shape that makes mul's shapes disagree) and bad flags each stop the run with a
# non-zero exit status (1 or 2, not a signal) and exactly one line on stderr naming the problem.
set -uo pipefail

RUNFILES="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}"
TRAIN="$RUNFILES/examples/mlp_regression/mlp_regression"
PROGRAM="$RUNFILES/examples/tessera_program"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# A short training run; sets rc and the files $TMP/stdout and $TMP/stderr.
train() {
  timeout 60 "$TRAIN" --epochs=2 --train_samples=1000 --test_samples=200 --batch_size=8 \
    --log_every_steps=0 "$@" >"$TMP/stdout" 2>"$TMP/stderr"
  rc=$?
}

# Expects exit status $1 and exactly one line on stderr containing each of the other arguments
# (fixed strings), after "--" the flags for train.
expect_error() {
  local want_rc=$1
  shift
  local texts=()
  while [ "$1" != "--" ]; do
    texts+=("$1")
    shift
  done
  shift
  train "$@"
  [ "$rc" = "$want_rc" ] || fail "$*: exit status $rc, want $want_rc"
  local lines
  lines=$(wc -l <"$TMP/stderr")
  [ "$lines" = "1" ] || fail "$*: $lines lines on stderr, want 1: $(cat "$TMP/stderr")"
  for t in "${texts[@]}"; do
    grep -qF -- "$t" "$TMP/stderr" || fail "$*: stderr lacks '$t': $(cat "$TMP/stderr")"
  done
  grep -q "final MSE" "$TMP/stdout" && fail "$*: it trained to the end"
}

main="$TMP/main.pbtxt"
startup="$TMP/startup.pbtxt"
"$PROGRAM" --example=mlp_regression --out="$main" --startup_out="$startup" >/dev/null ||
  fail "tessera_program could not write the programs"
[ -s "$main" ] && [ -s "$startup" ] || { echo "FAIL: no program files"; exit 1; }

# The unbroken programs train fine, and exactly like the built-in model (same losses).
train --program="$main" --startup_program="$startup"
[ "$rc" = 0 ] || fail "unbroken program: exit status $rc: $(cat "$TMP/stderr")"
[ -s "$TMP/stderr" ] && fail "unbroken program: stderr is not empty: $(cat "$TMP/stderr")"
grep -q "^read the program from $main" "$TMP/stdout" || fail "unbroken program: files not read"
grep "held-out MSE\|^final MSE" "$TMP/stdout" >"$TMP/from_files"
train
[ "$rc" = 0 ] || fail "built-in program: exit status $rc: $(cat "$TMP/stderr")"
grep "held-out MSE\|^final MSE" "$TMP/stdout" >"$TMP/built_in"
[ "$(wc -l <"$TMP/built_in")" = 3 ] || fail "built-in program: no MSE lines: $(cat "$TMP/stdout")"
cmp -s "$TMP/built_in" "$TMP/from_files" ||
  fail "the program files train differently: $(diff "$TMP/built_in" "$TMP/from_files")"
# Training helps: the last held-out MSE is below the first.
first=$(sed -n '1s/.*MSE //p' "$TMP/from_files")
last=$(sed -n '2s/.*MSE //p' "$TMP/from_files")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' ||
  fail "held-out MSE did not fall: $first -> $last"

# 1. Malformed text (line 5 of the main program): the parse error names file:line.
sed '5s/.*/    shape: [oops/' "$main" >"$TMP/malformed.pbtxt"
expect_error 1 "malformed.pbtxt:5:" "Expected integer" -- \
  --program="$TMP/malformed.pbtxt" --startup_program="$startup"
# ... in the startup program too, and a truncated file.
head -c 200 "$startup" >"$TMP/truncated_startup.pbtxt"
expect_error 1 "truncated_startup.pbtxt:" -- \
  --program="$main" --startup_program="$TMP/truncated_startup.pbtxt"

# 2. An op type renamed to an unknown one: the error names the op type.
sed '0,/type: "relu"$/ s/type: "relu"$/type: "relu_typo"/' "$main" >"$TMP/unknown_op.pbtxt"
grep -q 'type: "relu_typo"' "$TMP/unknown_op.pbtxt" || fail "could not rename the relu op"
expect_error 1 "unknown op type 'relu_typo'" -- \
  --program="$TMP/unknown_op.pbtxt" --startup_program="$startup"

# 3. hidden.w made [12, 100] in the startup program (declaration and initializer): the mul of
#    the [8, 10] input and the [12, 100] weight fails, naming the op, the variable and both shapes.
sed '/name: "hidden.w"$/,/}/ s/shape: 10$/shape: 12/;
     /arguments: "hidden.w"$/,/^  }/ s/v: 10$/v: 12/' "$startup" >"$TMP/bad_shape_startup.pbtxt"
[ "$(diff "$startup" "$TMP/bad_shape_startup.pbtxt" | grep -c '^>')" = 2 ] ||
  fail "could not change the shape of hidden.w in the startup program"
expect_error 1 "mul(" "'hidden.w' [12, 100]" "[8, 10]" "disagree" -- \
  --program="$main" --startup_program="$TMP/bad_shape_startup.pbtxt"

# Files that do not exist, and flags that do not go together.
expect_error 1 "$TMP/nope.pbtxt" -- --program="$TMP/nope.pbtxt" --startup_program="$startup"
expect_error 2 "--program and --startup_program go together" -- --program="$main"
expect_error 2 "--program and --startup_program go together" -- --startup_program="$startup"
expect_error 2 "--batch_size=0" -- --program="$main" --startup_program="$startup" --batch_size=0

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS"
