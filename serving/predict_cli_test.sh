#!/usr/bin/env bash
# tessera_predict end to end on a bundle written by hand (serving/test_bundle.h): one prediction
# per example, the summary line, --help, and one line on stderr with exit status 2 for bad
# flags, a missing or damaged bundle and unreadable data (1 when --out cannot be written).
set -uo pipefail
ROOT="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}"
BIN="$ROOT/serving/tessera_predict"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
# shellcheck source=tests/cli_test_lib.sh
source "$ROOT/tests/cli_test_lib.sh"

"$ROOT/serving/write_test_bundle" "$TMP" || { echo "FAIL: cannot write the test bundle"; exit 1; }
BUNDLE="$TMP/bundle"
DATA="$TMP/data.csv"
EXPORT="$BUNDLE/export-0000000042"

# Scoring: 200 examples, one %.9g probability per line, the summary on stdout.
run --bundle="$BUNDLE" --data="$DATA" --out="$TMP/pred.txt"
[ "$rc" = 0 ] || fail "scoring: exit status $rc: $(cat "$TMP/stderr")"
[ -s "$TMP/stderr" ] && fail "scoring wrote to stderr: $(cat "$TMP/stderr")"
[ "$(wc -l <"$TMP/pred.txt")" = 200 ] || fail "$(wc -l <"$TMP/pred.txt") predictions, want 200"
awk '!($1 > 0 && $1 < 1) { bad = 1 } END { exit bad }' "$TMP/pred.txt" ||
  fail "a prediction is not a probability: $(head -3 "$TMP/pred.txt")"
summary='^tessera_predict: 200 examples in [0-9.]+ s \([0-9]+ examples/s, 1 thread\); loss [0-9.]+ auc [0-9.]+ \(export-0000000042, step 42\)$'
grep -qE "$summary" "$TMP/stdout" || fail "summary line: $(cat "$TMP/stdout")"
loss16=$(grep -oE "loss [0-9.]+" "$TMP/stdout")

# The export directory itself, flags with spaces, another batch size: the same predictions (to
# float rounding) and a loss of batch means of 7.
run --bundle "$EXPORT" --data "$DATA" --out "$TMP/pred7.txt" --batch_size 7
[ "$rc" = 0 ] || fail "--batch_size 7: exit status $rc: $(cat "$TMP/stderr")"
paste "$TMP/pred.txt" "$TMP/pred7.txt" |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6) bad = 1 } END { exit bad }' ||
  fail "--batch_size=7 changed the predictions"
grep -qE "$summary" "$TMP/stdout" || fail "summary line with --batch_size=7: $(cat "$TMP/stdout")"

# Bad lines: skipped within --max_bad_lines (reported on stdout), an error beyond.
{ cat "$DATA"; echo "1,zzz,0.5,3"; } >"$TMP/bad.csv"
run --bundle="$BUNDLE" --data="$TMP/bad.csv" --out="$TMP/pred_bad.txt" --max_bad_lines=1
[ "$rc" = 0 ] || fail "--max_bad_lines=1: exit status $rc: $(cat "$TMP/stderr")"
grep -q "skipped 1 bad lines" "$TMP/stdout" || fail "no bad-line report: $(cat "$TMP/stdout")"
grep -q "$loss16" "$TMP/stdout" || fail "a skipped line changed the loss: $(cat "$TMP/stdout")"
expect_error 2 "bad.csv:202" --bundle="$BUNDLE" --data="$TMP/bad.csv" --out="$TMP/p"

# --help lists every flag with its default.
run --help
[ "$rc" = 0 ] || fail "--help: exit status $rc"
for flag in bundle data out batch_size max_bad_lines data_format float_dense csv_columns; do
  grep -qE -- "--$flag \(" "$TMP/stdout" || fail "--help lacks --$flag"
done
[ "$(grep -c "default:" "$TMP/stdout")" -ge 8 ] || fail "--help: flags without defaults"

# Bad flags and inputs.
expect_error 2 "--bundle is required" --data="$DATA" --out="$TMP/p"
expect_error 2 "--data is required" --bundle="$BUNDLE" --out="$TMP/p"
expect_error 2 "--out is required" --bundle="$BUNDLE" --data="$DATA"
expect_error 2 "--batch_size=-1" --bundle="$BUNDLE" --data="$DATA" --out="$TMP/p" --batch_size=-1
expect_error 2 "--batch_size=two" --bundle="$BUNDLE" --data="$DATA" --out="$TMP/p" --batch_size=two
expect_error 2 "--data_format=xml" --bundle="$BUNDLE" --data="$DATA" --out="$TMP/p" --data_format=xml
expect_error 2 "--float_dense=maybe" --bundle="$BUNDLE" --data="$DATA" --out="$TMP/p" --float_dense=maybe
expect_error 2 "--no_such_flag" --bundle="$BUNDLE" --data="$DATA" --out="$TMP/p" --no_such_flag
expect_error 2 "$TMP/nothing" --bundle="$TMP/nothing" --data="$DATA" --out="$TMP/p"
expect_error 2 "$TMP/missing.csv" --bundle="$BUNDLE" --data="$TMP/missing.csv" --out="$TMP/p"
expect_error 2 "$TMP/no_dir" --bundle="$BUNDLE" --data="$DATA" --out="$TMP/no_dir/p"
# Criteo's 40 fields are not this model's CSV.
expect_error 2 "data.csv:1" --bundle="$BUNDLE" --data="$DATA" --out="$TMP/p" --data_format=criteo
# --out is a directory: the rename fails after scoring.
mkdir -p "$TMP/out_dir"
expect_error 1 "--out=$TMP/out_dir" --bundle="$BUNDLE" --data="$DATA" --out="$TMP/out_dir"

# A damaged bundle file: DataLoss naming it, and no predictions written.
rm -f "$TMP/p"
cp "$EXPORT/dense.params" "$TMP/dense.params.orig"
printf 'X' | dd of="$EXPORT/dense.params" bs=1 seek=20 conv=notrunc 2>/dev/null
cmp -s "$EXPORT/dense.params" "$TMP/dense.params.orig" &&
  printf 'Y' | dd of="$EXPORT/dense.params" bs=1 seek=20 conv=notrunc 2>/dev/null
expect_error 2 "dense.params" --bundle="$BUNDLE" --data="$DATA" --out="$TMP/p"
[ -e "$TMP/p" ] && fail "a failed run wrote --out"

finish
