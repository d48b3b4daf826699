#!/usr/bin/env bash
# Where a running job's CPU goes, per process kind and thread name: starts a local cluster with
# the stock daemons (tessera_launch, the CTR example unless flags say otherwise), reads every
# daemon thread's user + system CPU from /proc/PID/task/TID/stat at second T0 and at second T1
# of the run, and prints the CPU seconds each kind of thread used in between (threads that
# started or ended in between are not counted), the cores busy, and the trainers' samples/s.
#
#   bazel build //deploy/launch:tessera_launch //pserver:tessera_pserver //trainer:tessera_trainer
#   tests/bench/thread_cpu.sh PSERVERS TRAINERS T0 T1 [launcher/daemon flags...]
#   e.g. tests/bench/thread_cpu.sh 2 2 3 6 --num_examples=480000 --batch_size=256
#
# Divide by the global steps run between T0 and T1 (samples/s x (T1 - T0) / global batch) for
# CPU per step; tests/bench/RESULTS.md has the figures. Pick T0 after start-up (the trainers'
# threads exist) and T1 before the epoch ends.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 4 ] || ! [[ "$1$2" =~ ^[0-9]+$ ]] || ! [[ "$3" =~ ^[0-9.]+$ && "$4" =~ ^[0-9.]+$ ]]; then
  echo "usage: tests/bench/thread_cpu.sh PSERVERS TRAINERS T0 T1 [flags...] (T0 < T1, seconds)" >&2
  exit 2
fi
PS=$1 TR=$2 T0=$3 T1=$4
shift 4
BIN=bazel-bin
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tessera-thread-cpu.XXXXXX")"
LAUNCH=""
cleanup() {
  [ -n "$LAUNCH" ] && kill "$LAUNCH" 2>/dev/null && wait "$LAUNCH" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
"$BIN/deploy/launch/tessera_launch" --pservers="$PS" --trainers="$TR" --example=ctr \
  --num_examples=480000 --num_test_examples=1000 --vocab_per_slot=10000 --epochs=1 \
  --log_every_steps=0 --log_dir="$WORK/logs" --noplot "$@" >"$WORK/launch.out" 2>&1 &
LAUNCH=$!
TICK=$(getconf CLK_TCK)
# One line per daemon thread: "kind:thread-name:tid ticks".
snapshot() {
  local pid kind t f
  for pid in $(pgrep -P "$LAUNCH" || true); do
    kind=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -oE "tessera_(pserver|trainer)" | head -1) || continue
    [ -n "$kind" ] || continue
    for t in /proc/"$pid"/task/*; do
      read -r -a f <"$t/stat" 2>/dev/null || continue
      # Fields after "(comm)": utime is field 14 and stime 15 of the whole line; comm may hold
      # spaces, so count from the end of the comm.
      local rest="${f[*]}"
      rest="${rest##*) }"
      read -r -a g <<<"$rest"
      echo "$kind:$(tr ' ' '_' <"$t/comm"):${t##*/} $((g[11] + g[12]))"
    done
  done
}
sleep "$T0"
snapshot | sort >"$WORK/s0"
sleep "$(awk -v a="$T0" -v b="$T1" 'BEGIN { print b - a }')"
snapshot | sort >"$WORK/s1"
wait "$LAUNCH" || { echo "the job failed:" >&2; tail -5 "$WORK/launch.out" >&2; exit 1; }
LAUNCH=""
if [ -z "$(join "$WORK/s0" "$WORK/s1")" ]; then
  echo "thread_cpu.sh: no daemon thread ran at both second $T0 and second $T1 (the job ends" \
    "before second $T1, or had not started its daemons at second $T0): pick another window" >&2
  exit 1
fi
echo "CPU seconds between second $T0 and second $T1 ($PS pserver(s), $TR trainer(s)):"
join "$WORK/s0" "$WORK/s1" | awk -v tick="$TICK" -v span="$(awk -v a="$T0" -v b="$T1" 'BEGIN { print b - a }')" '
  { split($1, k, ":"); key = k[1] " " k[2]; cpu[key] += ($3 - $2) / tick; all += ($3 - $2) / tick }
  END {
    for (key in cpu) printf "  %-40s %7.2f\n", key, cpu[key]
    printf "  %-40s %7.2f (%.2f cores busy)\n", "all", all, all / span
  }' | sort -k1,1
cat "$WORK"/logs/trainer.*.log | grep -oE "samples [0-9]+ samples/s [0-9.]+ seconds [0-9.]+" |
  awk '{ s += $2; if ($6 > t) t = $6 } END { if (t > 0) printf "samples/s (all trainers): %.0f\n", s / t }'
