#!/usr/bin/env bash
# The layer rules of DESIGN.md that Bazel visibility alone cannot state, checked with
# `bazel query` over the whole graph (tests/run_all.sh runs this after the build):
#   - no //trainer target depends on //pserver, and no //pserver target on //trainer;
#   - //transpiler and common/ depend on no runner (pserver, trainer), example or cluster wiring;
#   - the pserver binary links no trainer and no example code (it loads model files);
#   - serving/ (tessera_predict) sits above the runners: nothing below it depends on it;
#   - inside common/, the bottom two layers stay below the rest: common/base depends on nothing
#     of the repository, common/framework's libraries only on base and proto.
# Prints one "//tests:layering_check PASSED|FAILED" line (counted with the tests) and, on
# failure, the offending dependencies.
set -uo pipefail
cd "$(dirname "$0")/.."

failed=0
# rule NAME QUERY: the query must return nothing.
rule() {
  local name="$1" query="$2" out
  if ! out=$(bazel query --noshow_progress "$query" 2>/tmp/tessera-layering.err); then
    echo "layering: query for '$name' failed:"; cat /tmp/tessera-layering.err
    failed=1
    return
  fi
  if [ -n "$out" ]; then
    echo "layering: $name is broken by:"
    echo "$out" | sed 's/^/  /'
    failed=1
  fi
}
tests_and_cc='kind("source file", //...:*)'
rule "trainer -> pserver" "filter('^//pserver', deps(//trainer/...) except $tests_and_cc)"
rule "pserver -> trainer" "filter('^//trainer', deps(//pserver/...) except $tests_and_cc)"
rule "transpiler -> runners, examples, cluster wiring" \
  "filter('^//(pserver|trainer|examples|cluster|deploy)', deps(//transpiler/...) except $tests_and_cc)"
rule "common -> anything above it" \
  "filter('^//(pserver|trainer|examples|cluster|deploy|transpiler)', deps(//common/...) except $tests_and_cc)"
rule "common/base -> anything of the repository" \
  "filter('^//(common/(framework|ops|layers|device|io|rpc|collective|data|metrics|config)|proto)', deps(kind(cc_library, //common/base/...)))"
rule "common/framework -> common/ layers above it" \
  "filter('^//common/(ops|layers|device|io|rpc|collective|data|metrics|config)', deps(kind(cc_library, //common/framework/...)))"
rule "anything below serving -> serving" \
  "filter('^//serving', deps(//pserver/... + //trainer/... + //transpiler/... + //common/... + //cluster/...) except $tests_and_cc)"
rule "tessera_pserver links trainer or example code" \
  "filter('^//(trainer|examples)', deps(//pserver:tessera_pserver))"
rm -f /tmp/tessera-layering.err
if [ "$failed" -eq 0 ]; then
  echo "//tests:layering_check PASSED"
else
  echo "//tests:layering_check FAILED"
fi
exit "$failed"
