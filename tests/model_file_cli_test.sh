#!/usr/bin/env bash
# Bad model files stop both daemons at start, before training: one line naming the file and the
# problem, exit status 2. (The trainer's pserver address has nothing listening: the ABORT a
# failed trainer sends its pservers is refused at once.)
set -uo pipefail
ROOT="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}"
PS="$ROOT/pserver/tessera_pserver"
TR="$ROOT/trainer/tessera_trainer"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
# shellcheck source=tests/cli_test_lib.sh
source "$ROOT/tests/cli_test_lib.sh"

GOOD="$TMP/good.pbtxt"
"$ROOT/examples/tessera_program" --example=mlp_regression --model_out="$GOOD" >/dev/null ||
  { echo "FAIL: cannot write the model file"; exit 1; }

# mutate NAME SED_SCRIPT: a copy of the good file edited by sed.
mutate() {
  sed "$2" "$GOOD" >"$TMP/$1.pbtxt"
  cmp -s "$GOOD" "$TMP/$1.pbtxt" && fail "mutation $1 changed nothing"
}
mutate future 's/^format_version: 1$/format_version: 9/'
mutate unknown_op '0,/type: "relu"/s/type: "relu"/type: "relux"/'
mutate loss 's/^loss: .*/loss: "square_error.out_0"/'
mutate unbound '/^feeds {/,/^}/s/var: "x"/var: "nope"/'
mutate syntax 's/^loss: .*/loss "oops/'
mutate cycle '/parameter: "X"/{n;s/arguments: "scale.out_0"/arguments: "relu.out_0"/}'
mutate shape '/name: "hidden.mul"/,/}/s/shape: 100/shape: 7/'
mutate optimizer 's/type: "momentum"/type: "rmsprop"/'

# both NAME TEXT: each daemon refuses $TMP/NAME.pbtxt with TEXT.
both() {
  local model="$TMP/$1.pbtxt"
  expect_exit 2 "$2" "$PS" --pservers=127.0.0.1:9 --current_endpoint=127.0.0.1:9 --trainers=1 \
    --model="$model"
  expect_exit 2 "$2" "$TR" --pservers=127.0.0.1:9 --trainers=1 --model="$model"
  grep -qF "$model" "$TMP/stderr" || fail "$1: the error does not name $model"
}
both future "format_version 9 is newer than this build reads (1)"
both unknown_op "unknown op type 'relux'"
both loss "loss 'square_error.out_0' is float32 [-1, 1]; it must be a float32 scalar [1]"
both unbound "feed 'nope' names no variable of the forward program"
both syntax "syntax.pbtxt:"
both cycle "cycle: op 1 (mul) reads 'relu.out_0', which op 3 (relu) writes later"
both shape "shape mismatch: 'hidden.mul' is declared [-1, 7] but op 1 (mul) makes it [2, 100]"
both optimizer "optimizer type 'rmsprop' is unknown"
expect_exit 2 "cannot open $TMP/missing.pbtxt" "$TR" --pservers=127.0.0.1:9 --trainers=1 \
  --model="$TMP/missing.pbtxt"
finish
