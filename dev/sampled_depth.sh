#!/usr/bin/env bash
# Sampled recurrence depth at CPU scale (#51): fixed r = 4 against Huginn's sampled loop count (Poisson log-normal,
# mean 4, capped at 32: train.py --loops) with full BPTT of the drawn loops and with B = 2, at dev/ablate.sh
# --quick's cells (r = 4 at 1.1e12 and 2.4e12, d = 8-32), each at its own FLOP budget (a sampled run buys steps at
# the expectation of F over its draws), then every run at 1, 2, 4, 8, 16 and 32 test-time loops and under
# adaptive exit (dev/loop_curves.py). The two sampled arms are ablations of the base (their verdict against the
# committed fixed runs, cell by cell); the fixed runs are trained again here, into runs/, for their checkpoints.
#
#   bash dev/sampled_depth.sh         # ~25 min on 2 cores; OUT (dev/results/sampled-depth) gets loops.jsonl/.png
#
# Environment: CPU_JOBS (2), PYTHON, OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-dev/results/sampled-depth}"
HUGINN=(--loops poisson-lognormal --loops-mean 4 --loops-max 32)
CPU_JOBS="${CPU_JOBS:-2}" bash dev/ablate.sh huginn --quick -- "${HUGINN[@]}"
CPU_JOBS="${CPU_JOBS:-2}" bash dev/ablate.sh huginn-b2 --quick -- "${HUGINN[@]}" --r-bwd 2
# the fixed r = 4 runs once more, outside dev/results so that nothing is reused: checkpoints to score
CPU_JOBS="${CPU_JOBS:-2}" OUT=runs/sampled-depth-fixed ./sweep.sh --grid cpu-micro --budgets "1.1e12 2.4e12" --r 4 \
  --no-fit -- --compile
mkdir -p "$OUT"
"$PYTHON" dev/loop_curves.py runs/sampled-depth-fixed/runs/r4_* dev/results/cpu-micro-huginn-quick/runs/r4_* \
  dev/results/cpu-micro-huginn-b2-quick/runs/r4_* --loops 1,2,4,8,16,32 --exit kl --thresholds 1e-3,1e-2,1e-1 \
  --max-loops 16 --out "$OUT" | tee "$OUT/loop_curves.txt"
