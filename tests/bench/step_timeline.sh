#!/usr/bin/env bash
# Where a sync step of the CTR job goes, from both sides: runs a local cluster with the stock
# daemons and --trace (trainer 0 and every pserver write their timelines on one clock), then
# prints, per span name of trainer 0 and of pserver 0 (for the pserver, trainer 0's requests),
# the median first start and last end relative to the start of trainer 0's step, and the median
# summed duration, over the traced steps.
#
#   bazel build //deploy/launch:tessera_launch //pserver:tessera_pserver //trainer:tessera_trainer
#   tests/bench/step_timeline.sh [PSERVERS (default 1)] [TRAINERS (default 1)] [flags...]
#   e.g. tests/bench/step_timeline.sh 1 1 --num_examples=960000
#
# Steps 300 .. 1299 are traced (the job has 480000 examples of global batch 256 unless flags
# say otherwise: 1875 steps). Trainer spans are process 0, pserver 0's are process 1000 (see
# README "--trace"). What lies between a trainer's send and the pserver's send_barrier span is
# the request's way (encode, gRPC, decode); between the barrier's release and the send's end,
# the reply's.
set -euo pipefail
cd "$(dirname "$0")/../.."
PS="${1:-1}"
TR="${2:-1}"
if ! [[ "$PS$TR" =~ ^[0-9]+$ ]]; then
  echo "usage: tests/bench/step_timeline.sh [PSERVERS TRAINERS [flags...]] (got '$PS' '$TR')" >&2
  exit 2
fi
shift $(($# >= 2 ? 2 : $#))
BIN=bazel-bin
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tessera-step-timeline.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
"$BIN/deploy/launch/tessera_launch" --pservers="$PS" --trainers="$TR" --example=ctr \
  --num_examples=480000 --num_test_examples=1000 --vocab_per_slot=10000 --batch_size=256 \
  --epochs=1 --log_every_steps=0 --log_dir="$WORK/logs" --noplot --trace="$WORK/t.json" \
  --trace_first_step=300 --trace_steps=1000 "$@" >"$WORK/launch.out" 2>&1 ||
  { echo "the job failed:" >&2; tail -5 "$WORK/launch.out" >&2; exit 1; }
grep -hoE "samples/s [0-9]+" "$WORK"/logs/trainer.0.log | sed 's/^/trainer 0 (its own examples): /'
python3 - "$WORK/t.json" "$WORK/t.pserver0.json" <<'PY'
import collections, json, statistics, sys
spans = []
for path in sys.argv[1:]:
    spans += [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
steps = {e["args"]["step"]: e["ts"] for e in spans if e["pid"] == 0 and e["name"] == "step"}
# (step, pid, name, trainer) -> [first start, last end, summed duration] of such spans (a
# step's compute may be cut in two by a phase the look-ahead thread recorded meanwhile)
spanned = {}
for e in spans:
    key = (e["args"].get("step"), e["pid"], e["name"], e["args"].get("trainer", -1))
    if key[0] not in steps:
        continue
    s = spanned.setdefault(key, [e["ts"], e["ts"] + e["dur"], 0])
    s[0], s[1], s[2] = min(s[0], e["ts"]), max(s[1], e["ts"] + e["dur"]), s[2] + e["dur"]
rows = collections.defaultdict(list)
for (step, pid, name, trainer), (start, end, dur) in spanned.items():
    if trainer > 0:
        continue  # pserver spans of trainer 0 only
    rows[(pid, name)].append((start - steps[step], end - steps[step], dur))
print(f"{len(steps)} traced steps; microseconds from the start of trainer 0's step (medians)")
print(f"{'process':>8} {'span':<14} {'start':>7} {'end':>7} {'dur':>7}")
for (pid, name), v in sorted(rows.items(), key=lambda kv: statistics.median(x[0] for x in kv[1])):
    med = [statistics.median(x[i] for x in v) for i in range(3)]
    print(f"{pid:>8} {name:<14} {med[0]:>7.0f} {med[1]:>7.0f} {med[2]:>7.0f}")
PY
