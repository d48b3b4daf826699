#!/usr/bin/env bash
# tessera_pserver --serve_bundle as a process: it loads a bundle written by hand
# (serving/write_test_bundle), says what it serves, and exits 0 on SIGTERM and on SIGINT; a
# missing or damaged bundle is one line on stderr and exit status 2, before it listens.
set -uo pipefail
ROOT="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}"
PS="$ROOT/pserver/tessera_pserver"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
# shellcheck source=tests/cli_test_lib.sh
source "$ROOT/tests/cli_test_lib.sh"

"$ROOT/serving/write_test_bundle" "$TMP" || { echo "FAIL: cannot write the test bundle"; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# serve SIGNAL: starts a serving pserver, waits (at most 60 s: a loaded CI machine once took
# over 20 s to start it) for its "serving" line, sends SIGNAL and expects exit status 0 within
# 20 s. Without the line the signal is not sent: bash starts background commands with SIGINT
# ignored, so a SIGINT before the daemon blocks it for its sigwait would be lost.
serve() {
  local sig=$1 port pid rc=
  port=$(free_port)
  "$PS" --serve_bundle="$TMP/bundle" --pservers="127.0.0.1:$port" \
    --current_endpoint="127.0.0.1:$port" >"$TMP/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    grep -q ": serving .*export-0000000042 (step 42)" "$TMP/serve.log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q ": serving .*export-0000000042 (step 42)" "$TMP/serve.log"; then
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      fail "no serving line within 60 s: $(cat "$TMP/serve.log")"
    else
      # Gone before its line: say how (a status above 128 is a signal's), not "60 s".
      wait "$pid"
      rc=$?
      fail "exited with status $rc before its serving line: $(cat "$TMP/serve.log")"
    fi
    return
  fi
  kill "-$sig" "$pid" 2>/dev/null
  for _ in $(seq 200); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid"
    fail "still running 20 s after SIG$sig"
  fi
  wait "$pid"
  rc=$?
  [ "$rc" = 0 ] && echo "ok: SIG$sig -> exit 0" || fail "SIG$sig: exit status $rc: $(cat "$TMP/serve.log")"
}
serve TERM
serve INT

port=$(free_port)
expect_exit 2 "$TMP/nothing" "$PS" --serve_bundle="$TMP/nothing" --pservers="127.0.0.1:$port" \
  --current_endpoint="127.0.0.1:$port"
table=$(ls "$TMP"/bundle/export-0000000042/*.tbl | head -1)
printf 'XXXX' | dd of="$table" bs=1 seek=50 conv=notrunc 2>/dev/null
expect_exit 2 "$(basename "$table")" "$PS" --serve_bundle="$TMP/bundle" \
  --pservers="127.0.0.1:$port" --current_endpoint="127.0.0.1:$port"
finish
