#!/usr/bin/env bash
# generate_data: writes a valid, deterministic Criteo-format file, and answers each bad flag with
# one line on stderr and exit status 2.
set -uo pipefail

BIN="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}/examples/ctr/generate_data"
[ -x "$BIN" ] || BIN="examples/ctr/generate_data"
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/generate_data_test.XXXXXX")"
# shellcheck source=tests/cli_test_lib.sh
source "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}/tests/cli_test_lib.sh" 2>/dev/null ||
  source tests/cli_test_lib.sh

mkdir -p "$TMP/out"
run --out="$TMP/out/a.txt" --examples=1000 --seed=1
[ "$rc" = 0 ] || fail "generate: exit status $rc: $(cat "$TMP/stderr")"
grep -q "wrote 1000 examples" "$TMP/stdout" || fail "no summary line: $(cat "$TMP/stdout")"
[ "$(wc -l <"$TMP/out/a.txt")" = 1000 ] || fail "a.txt does not have 1000 lines"
# Every line: a 0/1 label, 13 non-negative integers, 26 ids of 16 hex digits.
bad_lines=$(awk -F'\t' '
  NF != 40 || $1 !~ /^[01]$/ { bad++; next }
  { for (i = 2; i <= 14; i++) if ($i !~ /^[0-9]+$/) { bad++; next }
    for (i = 15; i <= 40; i++) if ($i !~ /^[0-9a-f]+$/ || length($i) != 16) { bad++; next } }
  END { print bad + 0 }' "$TMP/out/a.txt")
[ "$bad_lines" = 0 ] || fail "$bad_lines malformed lines in a.txt"
positives=$(cut -f1 "$TMP/out/a.txt" | grep -c '^1$')
[ "$positives" -gt 100 ] && [ "$positives" -lt 400 ] || fail "$positives positives of 1000"

run --out="$TMP/out/b.txt" --examples=1000 --seed=1
cmp -s "$TMP/out/a.txt" "$TMP/out/b.txt" || fail "same flags, different files"
run --out="$TMP/out/c.txt" --examples=1000 --seed=2
cmp -s "$TMP/out/a.txt" "$TMP/out/c.txt" && fail "different seeds, same file"
run --out="$TMP/out/d.txt" --examples=10 --num_dense=2 --num_sparse=3 --vocab_per_slot=100000000 \
  --alpha=0.8 --model_seed=4
[ "$rc" = 0 ] || fail "small shape: exit status $rc: $(cat "$TMP/stderr")"
[ "$(awk -F'\t' '{ print NF }' "$TMP/out/d.txt" | sort -u)" = 6 ] || fail "d.txt: not 6 fields"
[ "$(ls "$TMP/out" | wc -l)" = 4 ] || fail "temporary files left: $(ls "$TMP/out")"

expect_error 2 "--out is required" --examples=10
expect_error 2 "--examples='abc'" --out="$TMP/x" --examples=abc
expect_error 2 "--examples must be >= 0, got -1" --out="$TMP/x" --examples=-1
expect_error 2 "--vocab_per_slot must be in [1, 2^40], got 0" --out="$TMP/x" --vocab_per_slot=0
expect_error 2 "--alpha must be finite and > 0, got 0" --out="$TMP/x" --alpha=0
expect_error 2 "--alpha='x'" --out="$TMP/x" --alpha=x
expect_error 2 "--seed='-1'" --out="$TMP/x" --seed=-1
expect_error 2 "--format='csv' is not supported" --out="$TMP/x" --format=csv
expect_error 2 "--num_sparse must be in [0, 65536], got 70000" --out="$TMP/x" --num_sparse=70000
expect_error 2 "unknown flag --bogus" --out="$TMP/x" --bogus=1
expect_error 2 "--examples needs a value" --out="$TMP/x" --examples
expect_error 2 "unexpected argument 'extra'" --out="$TMP/x" extra
[ -e "$TMP/x" ] && fail "a bad flag still wrote the output file"
expect_error 1 "$TMP/no/such/dir/x.txt" --out="$TMP/no/such/dir/x.txt" --examples=5

run --help
[ "$rc" = 0 ] && grep -q -- "--vocab_per_slot" "$TMP/stdout" || fail "--help: rc $rc"

finish
