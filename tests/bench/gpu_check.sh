#!/usr/bin/env bash
# The GPU checks on a machine that has a GPU, its driver, the CUDA 13 runtime, cuBLAS and NCCL but
# no build toolchain: `pack` (here, where Bazel builds) puts the --config=cuda tests, benches and
# daemons, with every shared library they load except glibc's and CUDA's, into one tar.gz;
# `run` (there) unpacks it and runs each test and bench, bounded, and writes their logs.
#
#   tests/bench/gpu_check.sh pack BUNDLE.tar.gz
#   tests/bench/gpu_check.sh run BUNDLE.tar.gz [LOG_DIR (default /tmp/gpu_check)]
#
# `run` prints one "== <name> rc=<exit status> <seconds>s" line per step with the gtest and
# samples/s lines under it; LOG_DIR/<name>.log holds each step's whole output and
# LOG_DIR/logs.tgz all of them. The steps: every CUDA test (each skips what needs more GPUs
# than the machine has), the daemons on a GPU against the CPU jobs (gpu_cluster_test, three
# times), gpu_train at batch 64 to 4096, the CTR job end to end on the CPU and on GPU 0
# (ctr_e2e.sh), and compute-sanitizer (memcheck, racecheck, synccheck) over the kernel and
# in-process training tests where it is installed.
set -uo pipefail
cd "$(dirname "$0")/../.."

TESTS=(common/device/cuda/cuda_device_test common/device/cuda/gpu_ops_test
  common/collective/nccl/nccl_communicator_test trainer/gpu_train_test
  trainer/nccl_place_reducer_test tests/gpu_cluster_test)
# Kept in Bazel's output layout: tessera_launch finds the daemons there, gpu_cluster_test
# through TEST_SRCDIR.
TREE=(pserver/tessera_pserver trainer/tessera_trainer deploy/launch/tessera_launch
  examples/ctr/ctr tests/bench/gpu_train)

pack() {
  local out="$1" stage
  stage="$(mktemp -d "${TMPDIR:-/tmp}/tessera-gpu-pack.XXXXXX")"
  trap 'rm -rf "$stage"' RETURN
  local t
  local -a labels=()
  for t in "${TESTS[@]}" "${TREE[@]}"; do labels+=("//$(dirname "$t"):$(basename "$t")"); done
  bazel build --config=cuda "${labels[@]}" 2>&1 | tail -1 || return 1
  mkdir -p "$stage/bin" "$stage/lib" "$stage/tree/tests/bench"
  for t in "${TESTS[@]}"; do cp -L "bazel-bin/$t" "$stage/bin/"; done
  for t in "${TREE[@]}"; do
    mkdir -p "$stage/tree/$(dirname "$t")"
    cp -L "bazel-bin/$t" "$stage/tree/$t"
  done
  cp tests/bench/ctr_e2e.sh "$stage/tree/tests/bench/"
  # Every library the loader resolves here (Bazel's own, Debian's) except glibc's and CUDA's,
  # which the GPU machine brings.
  for t in "${TESTS[@]}" "${TREE[@]}"; do ldd "bazel-bin/$t"; done | awk '/=>/ { print $1, $3 }' |
    grep -vE '^(libc|libm|libpthread|libdl|librt|ld-linux[^ ]*|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' |
    awk '{ print $2 }' | sort -u | while read -r lib; do
    if [ ! -e "$lib" ]; then
      echo "gpu_check.sh: a library is not found here: $lib" >&2
      return 1
    fi
    cp -L "$lib" "$stage/lib/"
  done || return 1
  tar -czf "$out" -C "$stage" bin lib tree && ls -la "$out"
}

run() {
  local bundle="$1" logs="${2:-/tmp/gpu_check}" b
  b="$(mktemp -d "${TMPDIR:-/tmp}/tessera-gpu.XXXXXX")"
  mkdir -p "$logs" "$b/tmp"
  tar -xzf "$bundle" -C "$b" || { echo "gpu_check.sh: cannot unpack $bundle"; rm -rf "$b"; return 1; }
  local all="$logs/all.log"
  : >"$all"
  say() { echo "$@" | tee -a "$all"; }
  say "== $(date +%T) $(nvidia-smi -L 2>&1 | head -1); $(ldd --version 2>&1 | head -1)"
  # The CUDA libraries: the toolkit's, else wherever the machine has them (a pip wheel's).
  local dirs="" n p
  for n in libcublas.so.13 libcublasLt.so.13 libcudart.so.13 libnccl.so.2; do
    p=$(ls /usr/local/cuda/lib64/$n 2>/dev/null || find /usr /opt -name "$n" 2>/dev/null | head -1)
    say "$n -> ${p:-NOT FOUND}"
    [ -n "$p" ] && dirs="$dirs:$(dirname "$p")"
  done
  export LD_LIBRARY_PATH="$b/lib$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  for t in "$b"/bin/* "${TREE[@]/#/$b/tree/}"; do
    ldd "$t" | grep "not found" | sed "s|^|$(basename "$t"): |" | tee -a "$all"
  done
  # gpu_cluster_test's daemons: $TEST_SRCDIR/tessera/<package>/<binary>.
  mkdir -p "$b/srcdir"
  ln -s "$b/tree" "$b/srcdir/tessera"
  export TEST_SRCDIR="$b/srcdir" TEST_TMPDIR="$b/tmp"
  step() { # NAME SECONDS COMMAND...
    local name="$1" secs="$2" start rc
    shift 2
    start=$(date +%s.%N)
    timeout "$secs" "$@" >"$logs/$name.log" 2>&1
    rc=$?
    say "== $name rc=$rc $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')s"
    grep -E '^\[  (FAILED|PASSED|  OK|SKIPPED) |^(cpu|gpu|speedup|SKIPPED)|^\| |ERROR SUMMARY|rror' \
      "$logs/$name.log" | head -40 | tee -a "$all"
    tar -czf "$logs/logs.tgz" -C "$logs" --exclude=logs.tgz --warning=no-file-changed .
  }
  for t in "$b"/bin/*; do step "$(basename "$t")" 120 "$t"; done
  step gpu_cluster_test_x3 240 "$b/bin/gpu_cluster_test" --gtest_repeat=3
  local bs
  for bs in 64 256 1024 4096; do
    step "gpu_train_b$bs" 120 "$b/tree/tests/bench/gpu_train" --examples=65536 --batch_size="$bs"
  done
  step ctr_e2e 300 env CTR_E2E_BIN="$b/tree" CTR_E2E_ONLY="single,1x1 sync,1x1 sync devices=0" \
    "$b/tree/tests/bench/ctr_e2e.sh" 3 240000
  if command -v compute-sanitizer >/dev/null; then
    for t in gpu_ops_test cuda_device_test gpu_train_test; do
      step "memcheck_$t" 120 compute-sanitizer --tool memcheck "$b/bin/$t"
    done
    step racecheck_gpu_ops_test 60 compute-sanitizer --tool racecheck "$b/bin/gpu_ops_test"
    step synccheck_gpu_ops_test 60 compute-sanitizer --tool synccheck "$b/bin/gpu_ops_test"
  else
    say "compute-sanitizer: not installed, skipped"
  fi
  say "== $(date +%T) done"
  rm -rf "$b"
}

case "${1:-}:$#" in
  pack:2) pack "$2" ;;
  run:2 | run:3) run "$2" "${3:-}" ;;
  *)
    echo "usage: $0 pack BUNDLE.tar.gz | run BUNDLE.tar.gz [LOG_DIR]" >&2
    exit 2
    ;;
esac
