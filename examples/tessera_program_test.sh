#!/usr/bin/env bash
# tessera_program: writes both examples' programs, reads them back through --program (same
# summary), and fails with one line and a non-zero status on bad input.
set -uo pipefail

BIN="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}/examples/tessera_program"
[ -x "$BIN" ] || BIN="examples/tessera_program"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
# shellcheck source=tests/cli_test_lib.sh
source "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}/tests/cli_test_lib.sh" 2>/dev/null ||
  source tests/cli_test_lib.sh

# The summary from its "block 0" line on (the title line names the source).
block_summary() {
  sed -n '/^block 0 /,$p' "$1"
}

for example in mlp_regression ctr; do
  main="$TMP/$example.main.pbtxt"
  startup="$TMP/$example.startup.pbtxt"
  run --example=$example --out="$main" --startup_out="$startup"
  [ "$rc" = 0 ] || fail "$example: exit status $rc: $(cat "$TMP/stderr")"
  [ -s "$main" ] && [ -s "$startup" ] || fail "$example: program files not written"
  grep -q "^  #[0-9]* *\[forward\] *mul(X=" "$TMP/stdout" || fail "$example: no forward mul op"
  grep -q "\[optimize\]" "$TMP/stdout" || fail "$example: no optimize op"
  grep -q "persistable trainable" "$TMP/stdout" || fail "$example: no parameter listed"
  # The main program's summary, as printed from the builder.
  sed -n '/^== main program/,/^== startup program/p' "$TMP/stdout" | sed '1d;$d' >"$TMP/built"

  # Round trip: the written file summarizes to the same variables and ops.
  run --program="$main"
  [ "$rc" = 0 ] || fail "$example: --program exit status $rc: $(cat "$TMP/stderr")"
  block_summary "$TMP/stdout" >"$TMP/read"
  [ -s "$TMP/read" ] || fail "$example: empty summary of $main"
  diff -u "$TMP/built" "$TMP/read" >/dev/null || fail "$example: summary of the file differs"
  run --program="$startup"
  [ "$rc" = 0 ] || fail "$example: startup --program exit status $rc"

  # Deterministic: a second run writes the same bytes.
  run --example=$example --out="$TMP/again.pbtxt"
  cmp -s "$main" "$TMP/again.pbtxt" || fail "$example: two runs wrote different programs"
done

grep -q "lookup_table(" "$TMP/ctr.main.pbtxt" 2>/dev/null || grep -q 'type: "lookup_table"' \
  "$TMP/ctr.main.pbtxt" || fail "ctr: no lookup_table in the written program"
run --example=ctr --distributed
[ "$rc" = 0 ] || fail "ctr --distributed: exit status $rc"
grep -q "^  emb_0 .*sparse distributed" "$TMP/stdout" || fail "ctr --distributed: emb_0 not flagged"
grep -q "^  emb_0 .*sparse" "$TMP/stdout" || fail "ctr: emb_0 not sparse"

# Malformed and unreadable files: one line, status 1, naming the file.
printf 'blocks {\n  idx: 0\n  ops { type: "mul" \n' >"$TMP/truncated.pbtxt"
expect_error 1 "truncated.pbtxt" --program="$TMP/truncated.pbtxt"
printf 'blocks { idx: "zero" }\n' >"$TMP/badvalue.pbtxt"
expect_error 1 "badvalue.pbtxt:1:" --program="$TMP/badvalue.pbtxt"
expect_error 1 "no_such_file.pbtxt" --program="$TMP/no_such_file.pbtxt"
expect_error 1 "startup" --example=mlp_regression --startup_out="$TMP/no_such_dir/startup.pbtxt"

# Bad flags: one line, status 2.
expect_error 2 "unknown example 'nope'" --example=nope
expect_error 2 "unknown flag --frobnicate" --example=ctr --frobnicate=1
expect_error 2 "exactly one of --example and --program"
expect_error 2 "exactly one of --example and --program" --example=ctr --program=x.pbtxt
expect_error 2 "--example needs a value" --example
expect_error 2 "--distributed applies only to --example=ctr" --example=mlp_regression --distributed

run --help
[ "$rc" = 0 ] || fail "--help: exit status $rc"

finish
