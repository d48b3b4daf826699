# Shared harness for tests that run a command-line tool: source it after setting BIN (the tool)
# and TMP (a scratch directory). Provides:
#   fail MSG                  count a failure and print it
#   run ARGS...               run $BIN; sets rc and the files $TMP/stdout and $TMP/stderr
#   expect_error RC TEXT ARGS...
#                             expect exit status RC and exactly one stderr line containing TEXT
#   expect_exit RC TEXT COMMAND...
#                             like expect_error for any command, bounded to 20 s
#   expect_auc_above LOG MIN  the last "auc X" (any case) of LOG is above MIN
#   finish                    exit 1 if anything failed, else print PASS
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

run() {
  "$BIN" "$@" >"$TMP/stdout" 2>"$TMP/stderr"
  rc=$?
}

expect_error() {
  local want_rc=$1 want_text=$2
  shift 2
  run "$@"
  [ "$rc" = "$want_rc" ] || fail "$*: exit status $rc, want $want_rc"
  local lines
  lines=$(wc -l <"$TMP/stderr")
  [ "$lines" = "1" ] || fail "$*: $lines lines on stderr, want 1: $(cat "$TMP/stderr")"
  grep -qF -- "$want_text" "$TMP/stderr" || fail "$*: stderr lacks '$want_text': $(cat "$TMP/stderr")"
}

expect_exit() {
  local want_rc=$1 want_text=$2
  shift 2
  timeout 20 "$@" >"$TMP/stdout" 2>"$TMP/stderr"
  rc=$?
  local lines
  lines=$(grep -c . "$TMP/stderr")
  if [ "$rc" != "$want_rc" ] || [ "$lines" != 1 ] || ! grep -qF -- "$want_text" "$TMP/stderr"; then
    fail "$* -> exit $rc (want $want_rc), $lines stderr line(s), want one with '$want_text': $(cat "$TMP/stderr")"
  else
    echo "ok: $(cat "$TMP/stderr")"
  fi
}

# The last held-out AUC a trainer or runner log reports ("" if none).
last_auc() {
  grep -oiE "auc [0-9.]+" "$1" | tail -1 | cut -d' ' -f2
}

expect_auc_above() {
  local auc
  auc=$(last_auc "$1")
  if [ -n "$auc" ] && awk -v a="$auc" -v m="$2" 'BEGIN { exit !(a > m) }'; then
    echo "ok: $1: held-out AUC $auc"
  else
    fail "$1: held-out AUC '${auc:-none}' is not above $2: $(tail -5 "$1")"
  fi
}

finish() {
  if [ "$failures" != 0 ]; then
    echo "$failures check(s) failed"
    exit 1
  fi
  echo "PASS"
}
