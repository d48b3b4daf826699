#!/usr/bin/env bash
# Runs the Python package's unittest suite (python/tests) under Bazel: the package from the
# runfiles tree, Debian's interpreter (it has python3-protobuf), and the C++ tools the tests
# compare against (tessera_program, tessera_transpile), which must be there.
set -euo pipefail
ROOT="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}"
PYTHON="${TESSERA_PYTHON:-/usr/bin/python3}"
export TESSERA_PROGRAM_BIN="$ROOT/examples/tessera_program"
export TESSERA_TRANSPILE_BIN="$ROOT/cluster/tessera_transpile"
for bin in "$TESSERA_PROGRAM_BIN" "$TESSERA_TRANSPILE_BIN"; do
  [ -x "$bin" ] || { echo "run_tests: $bin is missing"; exit 1; }
done
export PYTHONPATH="$ROOT/python"
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export HOME="${TEST_TMPDIR:-$(mktemp -d)}"
cd "$ROOT"
# -v: one line per test in the log; a skipped test is listed with its reason.
"$PYTHON" -m unittest discover -v -s python/tests 2>&1 | tee "$HOME/unittest.log"
status=${PIPESTATUS[0]}
# Inside Bazel every tool is present, so nothing may be skipped.
if grep -q "skipped" "$HOME/unittest.log"; then
  echo "run_tests: some tests were skipped"
  exit 1
fi
exit "$status"
