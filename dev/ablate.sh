#!/usr/bin/env bash
# One ablation at CPU scale, in one command: a variant of the cpu-micro grid (train.py flags), trained only
# where it differs from the committed base (sweep.sh --variant reuses every committed run with its identity:
# here the r = 1 runs, which no injection or loop flag changes), then its answer (dev/ablation_report.py):
# the paired table against the base next to the noise of retraining and reseeding, delta-phi with its 95% CI
# on the layout-matched and on the plain r = 1, and a figure of both arms' frontiers.
#
#   bash dev/ablate.sh gated -- --injection gated           # the full arm: the 42 looped runs of cpu-micro
#   bash dev/ablate.sh gated --quick -- --injection gated   # r = 4 at 1.1e12 and 2.4e12 (7 runs): the paired table
#
# OUT (default dev/results/cpu-micro-NAME, -quick for --quick) holds the rows, logs, run folders and fit/:
# compare.json / compare_layout.json (fit_laws.py --compare against each anchor), ablation.txt, ablation.png.
# --quick fits its delta-phi on the same cells of the base (fit/base.jsonl, fit/layout.jsonl) without a
# bootstrap, from 100 random starts: one looped r at two budgets does not identify phi, so its answer is the
# paired table.
# Its runs train with --compile (not part of a run's identity): on CPU it compiles each block, a few seconds a
# run once inductor's cache holds a width, for 1.1-1.6x the eager step (dev/bench_train.py).
# Environment: CPU_JOBS (default 2), PYTHON, OUT, COMPILE (default 1; 0 trains eagerly).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: bash dev/ablate.sh NAME [--quick] -- TRAIN_FLAGS"
[ $# -ge 1 ] && [[ "$1" != -* ]] || { echo "ablate.sh: $usage" >&2; exit 2; }
NAME="$1"; shift
QUICK=""
if [ "${1:-}" = --quick ]; then QUICK=1; shift; fi
[ "${1:-}" = -- ] && [ $# -ge 2 ] || { echo "ablate.sh: the train.py flags that make the variant go after -- ($usage)" >&2; exit 2; }
shift
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-dev/results/cpu-micro-$NAME${QUICK:+-quick}}"
COMPILE_FLAG=(--compile)
if [ "${COMPILE:-1}" = 0 ]; then COMPILE_FLAG=(); fi
BASE=dev/results/cpu-micro/results.jsonl
LAYOUT=dev/results/cpu-micro-layout/results.jsonl
SUBSET=()
FIT_FLAGS=()
if [ -n "$QUICK" ]; then
  # One looped r at the middle budgets, whose best widths lie inside the grid (d = 16-24): 7 runs, the
  # paired table's answer in minutes.
  SUBSET=(--budgets "1.1e12 2.4e12" --r "1 4")
  # Its delta-phi is a point estimate, so its fits search from 100 random starts, not the protocol's 500: on
  # the committed quick arm every joint fit's phi is the 500-start one to 4 digits, and the fits and report
  # take 29 s instead of 159 s; one restricted (phi = 1) fit in compare.txt stops at a slightly worse optimum.
  FIT_FLAGS=(--bootstrap 0 --restarts 100)
fi
start=$(date +%s)
CPU_JOBS="${CPU_JOBS:-2}" OUT="$OUT" ./sweep.sh --grid cpu-micro --variant "$NAME" --no-fit "${SUBSET[@]}" -- "$@" "${COMPILE_FLAG[@]}"
trained=$(date +%s)
mkdir -p "$OUT/fit"
if [ -n "$QUICK" ]; then  # the base on the variant's cells only, so that both arms have the same design
  "$PYTHON" dev/ablation_report.py "$OUT" --same-cells "$BASE" > "$OUT/fit/base.jsonl"
  "$PYTHON" dev/ablation_report.py "$OUT" --same-cells "$LAYOUT" > "$OUT/fit/layout.jsonl"
  BASE="$OUT/fit/base.jsonl"
  LAYOUT="$OUT/fit/layout.jsonl"
fi
"$PYTHON" dev/ablation_report.py "$OUT" --layout-anchored-rows > "$OUT/fit/layout_anchored.jsonl"
"$PYTHON" fit_laws.py "$BASE" --compare "$OUT/results.jsonl" "${FIT_FLAGS[@]}" --json "$OUT/fit/compare.json" \
  > "$OUT/fit/compare.txt"
"$PYTHON" fit_laws.py "$LAYOUT" --compare "$OUT/fit/layout_anchored.jsonl" "${FIT_FLAGS[@]}" \
  --json "$OUT/fit/compare_layout.json" > "$OUT/fit/compare_layout.txt"
"$PYTHON" dev/ablation_report.py "$OUT" | tee "$OUT/fit/ablation.txt"
if [ -n "$QUICK" ]; then
  echo "(--quick: one looped r at two budgets does not identify phi; its delta-phi is a point estimate without a CI)" |
    tee -a "$OUT/fit/ablation.txt"
fi
echo "ablate.sh $NAME: trained in $(( (trained - start) / 60 )) min, fits and report in $(( $(date +%s) - trained )) s" |
  tee -a "$OUT/fit/ablation.txt"
