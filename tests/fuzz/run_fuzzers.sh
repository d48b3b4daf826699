#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang (-fsanitize=fuzzer,address,undefined)
# outside Bazel (whose toolchain is gcc) and runs each for FUZZ_SECONDS, starting from its seed
# corpus in tests/fuzz/corpus/<name>/. Fails if a target does not build or finds a crash, a leak,
# an undefined-behaviour report or a timeout; the input that failed is copied to
# $FUZZ_ARTIFACTS (default /tmp/tessera-fuzz-artifacts) so that it can be added to the corpus.
# Everything else lives in a temporary directory that is removed on exit.
#
# Prints one line per target, "//tests/fuzz:<name>_fuzzer (libFuzzer, N s) PASSED|FAILED", which
# tests/run_all.sh counts with the Bazel tests.
#
# Environment: FUZZ_SECONDS (default 60) per target; FUZZ_TARGETS (default "codec program
# criteo formats model_file bundle"); FUZZ_JOBS (default 2) parallel compilations; CXX (default
# clang++).
set -uo pipefail
cd "$(dirname "$0")/../.."

FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
FUZZ_TARGETS="${FUZZ_TARGETS:-codec program criteo formats model_file bundle}"
FUZZ_JOBS="${FUZZ_JOBS:-2}"
FUZZ_ARTIFACTS="${FUZZ_ARTIFACTS:-/tmp/tessera-fuzz-artifacts}"
CXX="${CXX:-clang++}"

if ! [[ "$FUZZ_SECONDS" =~ ^[0-9]+$ ]] || [ "$FUZZ_SECONDS" -lt 1 ]; then
  echo "run_fuzzers: FUZZ_SECONDS='$FUZZ_SECONDS' is not a positive number of seconds" >&2
  exit 2
fi
if ! command -v "$CXX" >/dev/null || ! command -v protoc >/dev/null; then
  echo "run_fuzzers: needs $CXX and protoc (deploy/setup installs clang, libclang-rt-14-dev)" >&2
  echo "//tests/fuzz:build (clang) FAILED"
  exit 1
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/tessera-fuzz.XXXXXX")"
cleanup() {
  # Children (a fuzzer still running when we are interrupted) first, then the files.
  jobs -p | xargs -r kill 2>/dev/null
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Library sources each target needs (repo-relative), beside the generated protobuf code.
declare -A SRCS
SRCS[codec]="common/rpc/grpc/codec.cc common/rpc/request_checks.cc common/framework/tensor.cc common/framework/place.cc"
SRCS[criteo]="common/data/criteo.cc common/data/formats.cc common/data/idx.cc common/io/file_system.cc"
SRCS[formats]="${SRCS[criteo]}"
SRCS[program]="common/framework/tensor.cc common/framework/place.cc common/framework/program_io.cc common/framework/executor.cc common/framework/op_registry.cc
  common/framework/op_desc.cc common/framework/scope.cc common/ops/ops.cc common/ops/basic_ops.cc common/ops/math_ops.cc
  common/ops/activation_ops.cc common/ops/loss_ops.cc common/ops/tensor_ops.cc
  common/ops/random_ops.cc common/ops/embedding_ops.cc common/ops/optimizer_ops.cc
  common/ops/selected_rows_util.cc common/ops/dist_ops.cc common/ops/merge_plan.cc common/ops/sequence_ops.cc
  common/ops/nn_ops.cc common/ops/small_gemm.cc
  common/layers/program_builder.cc
  transpiler/distribute_transpiler.cc"
SRCS[model_file]="${SRCS[program]} common/layers/model_file.cc common/layers/optimizer.cc common/layers/backward.cc"
SRCS[bundle]="common/io/bundle.cc common/io/checkpoint_io.cc common/io/file_system.cc common/io/crc32c.cc
  pserver/sparse_table.cc pserver/chunk_arena.cc"
declare -A PROTOS
PROTOS[codec]="tensor program pserver"
PROTOS[criteo]=""
PROTOS[formats]=""
PROTOS[program]="tensor program"
PROTOS[model_file]="tensor program model"
PROTOS[bundle]="tensor program"
# Extra compiler flags of a source, as the copts of its Bazel library.
src_cflags() {
  case "$1" in
    pserver/sparse_table.cc | common/ops/optimizer_ops.cc) echo "-DEIGEN_FAST_MATH=0" ;;
  esac
}

ABSL_PKGS="absl_strings absl_str_format absl_synchronization absl_status absl_statusor absl_time
  absl_hash absl_raw_hash_set absl_random_random"
PKG_CFLAGS="$(pkg-config --cflags grpc++ protobuf $ABSL_PKGS)" || exit 1
PKG_LIBS="$(pkg-config --libs grpc++ protobuf zlib $ABSL_PKGS)" || exit 1
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
CXXFLAGS="-std=c++17 -O1 -g -fno-omit-frame-pointer -w -I. -I$work/gen -I/usr/include/eigen3
  $PKG_CFLAGS"

mkdir -p "$work/gen" "$work/obj"
echo "run_fuzzers: building in $work ($CXX, ${FUZZ_JOBS} jobs)"
protoc -I. --cpp_out="$work/gen" proto/tensor.proto proto/program.proto proto/pserver.proto \
  proto/model.proto ||
  { echo "//tests/fuzz:build (clang) FAILED"; exit 1; }

# Every object any target needs, compiled once (libFuzzer's coverage instrumentation without its
# main: -fsanitize=fuzzer-no-link), FUZZ_JOBS at a time.
all_srcs=()
for t in $FUZZ_TARGETS; do
  [ -n "${SRCS[$t]+x}" ] || { echo "run_fuzzers: unknown target '$t'" >&2; exit 2; }
  # shellcheck disable=SC2206
  all_srcs+=(${SRCS[$t]})
done
for p in tensor program pserver model; do all_srcs+=("$work/gen/proto/$p.pb.cc"); done
obj_of() { echo "$work/obj/$(echo "$1" | sed "s|^$work/||; s|/|_|g; s|\.cc$|.o|")"; }
export -f obj_of src_cflags
export work CXX CXXFLAGS SAN
printf '%s\n' "${all_srcs[@]}" | sort -u | xargs -P "$FUZZ_JOBS" -I{} bash -c '
  src="$1"; obj="$(obj_of "$src")"
  $CXX $CXXFLAGS $(src_cflags "$src") $SAN -fsanitize=fuzzer-no-link -c "$src" -o "$obj" ||
    { echo "run_fuzzers: cannot compile $src" >&2; exit 255; }' _ {} &
# In the background so that a signal reaches the traps (and cleanup) at once.
if ! wait $!; then echo "//tests/fuzz:build (clang) FAILED"; exit 1; fi

failed=0
for t in $FUZZ_TARGETS; do
  name="${t}_fuzzer"
  label="//tests/fuzz:${name} (libFuzzer, ${FUZZ_SECONDS} s)"
  objs=()
  for s in ${SRCS[$t]}; do objs+=("$(obj_of "$s")"); done
  for p in ${PROTOS[$t]}; do objs+=("$(obj_of "$work/gen/proto/$p.pb.cc")"); done
  # shellcheck disable=SC2086
  if ! $CXX $CXXFLAGS $SAN -fsanitize=fuzzer "tests/fuzz/${name}.cc" "${objs[@]}" $PKG_LIBS \
      -lpthread -o "$work/$name"; then
    echo "$label FAILED (does not build)"
    failed=1
    continue
  fi
  # New inputs go to a scratch corpus; the committed seeds are only read.
  mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
  log="$work/$name.log"
  # -max_total_time bounds the run; timeout(1) bounds a fuzzer that would not stop.
  # TMPDIR: scratch files of a target (criteo) live and die with $work.
  TMPDIR="$work" timeout -k 10 $((FUZZ_SECONDS + 60)) "$work/$name" \
    -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/$t/" "$work/corpus/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1 &
  wait $!
  rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "$label PASSED ($(grep -m1 -oE 'stat::number_of_executed_units: *[0-9]+' "$log" |
      grep -oE '[0-9]+$') inputs)"
  else
    echo "$label FAILED (exit $rc)"
    grep -v 'libprotobuf ERROR' "$log" | tail -n 40 | sed 's/^/    /'
    if compgen -G "$work/artifacts/$t/*" >/dev/null; then
      mkdir -p "$FUZZ_ARTIFACTS/$t"
      cp "$work/artifacts/$t/"* "$FUZZ_ARTIFACTS/$t/"
      echo "    failing input(s) copied to $FUZZ_ARTIFACTS/$t/" \
        "(add to tests/fuzz/corpus/$t/ once fixed)"
    fi
    failed=1
  fi
done
exit "$failed"
