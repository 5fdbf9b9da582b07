#!/usr/bin/env bash
# Diagnose the CPU-scale looping penalty (the finding that r = 2, 4, 8 all trail r = 1 by ~0.1 nats).
# Every run is at the lowest cpu-micro budget (1.5e12 FLOPs) and its best width (d = 16, s = 0.25)
# unless its line says otherwise, with the cpu-micro flags of sweep.sh, so each number compares
# directly with the grid's seed-0 rows in dev/results/cpu-micro-v2-flat/results.jsonl (the earlier grid):
#   layout   r = 1 with the looped layout (prelude 2 + a 16-layer block run once + coda 2), with
#            linear injection and with passthrough (whose only difference from the plain 20-layer
#            stack is where the recurrent norm sits), the latter also at d = 24
#   inject   r = 4 with additive and with passthrough injection (the grid used linear)
#   seeds    seeds 1 and 2 for every r (run-to-run noise)
#   lrnorm   the norm scales' AdamW base LR at 0.05, 0.15 and 0.5 (paper: 0.005)
#   lr       MuonH base LR 0.028 and 0.112 (the grid: 0.056) for r = 1 and 4 at norm LR 0.05, and
#            0.014-0.112 for r = 1, 2, 4, 8 at norm LR 0.15 (r = 2 with a second seed at 0.056;
#            0.007 for r = 2 and 4)
#
#   bash dev/diagnose_micro.sh              # 49 runs, ~2 h with CPU_JOBS=1; rows in dev/results/diagnostics/results.jsonl
#   CPU_JOBS=2 bash dev/diagnose_micro.sh   # two at a time, one thread each
#   bash dev/diagnose_micro.sh --list       # the runs, one "NAME flags" line each
# Finished runs are skipped (their row is in the results file), so it can be rerun after a kill.
set -euo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-runs/diagnostics}" RESULTS="${RESULTS:-dev/results/diagnostics/results.jsonl}"
plan() {  # one "NAME flags" line per run
  echo "layout_linear   --r 1 --recur 16 --injection linear --scale 0.25"
  echo "layout_pass     --r 1 --recur 16 --injection passthrough --scale 0.25"
  echo "layout_pass_s0.375 --r 1 --recur 16 --injection passthrough --scale 0.375"
  echo "r4_additive     --r 4 --injection additive --scale 0.25"
  echo "r4_passthrough  --r 4 --injection passthrough --scale 0.25"
  for seed in 1 2; do for r in 1 2 4 8; do echo "r${r}_seed$seed --r $r --seed $seed --scale 0.25"; done; done
  # The norm scales' AdamW LR (paper base 0.005): does a faster one undo the mid-network norm's cost?
  for r in 1 2 4 8; do echo "r${r}_lrnorm0.05 --r $r --lr-norm 0.05 --scale 0.25"; done
  echo "layout_pass_lrnorm0.05 --r 1 --recur 16 --injection passthrough --lr-norm 0.05 --scale 0.25"
  for r in 1 2 4 8; do echo "r${r}_lrnorm0.15 --r $r --lr-norm 0.15 --scale 0.25"; done
  for r in 1 4; do echo "r${r}_lrnorm0.5 --r $r --lr-norm 0.5 --scale 0.25"; done
  # MuonH base LR around 0.056 at the faster norm LR: do r = 1 and r = 4 agree on the optimum?
  for lr in 0.028 0.112; do for r in 1 4; do echo "r${r}_lrnorm0.05_lr$lr --r $r --lr-norm 0.05 --lr-matrix $lr --scale 0.25"; done; done
  # The grid's MuonH base LR (0.056) for the key comparisons: seed noise, layout, norm LR
  for seed in 1 2; do echo "r1_seed${seed}_lr0.056 --r 1 --seed $seed --lr-matrix 0.056 --scale 0.25"; done
  echo "layout_pass_lr0.056 --r 1 --recur 16 --injection passthrough --lr-matrix 0.056 --scale 0.25"
  for r in 1 4; do echo "r${r}_lrnorm0.15_lr0.056 --r $r --lr-norm 0.15 --lr-matrix 0.056 --scale 0.25"; done
  echo "r4_seed1_lr0.056 --r 4 --seed 1 --lr-matrix 0.056 --scale 0.25"
  # A slice of the joint calibration: MuonH base LR at norm LR 0.15 for r = 1, 4, 8, and a second seed at two optima
  for r in 1 4 8; do echo "r${r}_lrnorm0.15_lr0.028 --r $r --lr-norm 0.15 --lr-matrix 0.028 --scale 0.25"; done
  echo "r8_lrnorm0.15_lr0.056 --r 8 --lr-norm 0.15 --lr-matrix 0.056 --scale 0.25"
  for r in 1 4 8; do echo "r${r}_lrnorm0.15_lr0.112 --r $r --lr-norm 0.15 --lr-matrix 0.112 --scale 0.25"; done
  echo "r1_lrnorm0.15_lr0.056_seed1 --r 1 --lr-norm 0.15 --lr-matrix 0.056 --seed 1 --scale 0.25"
  echo "r4_lrnorm0.15_seed1 --r 4 --lr-norm 0.15 --seed 1 --scale 0.25"
  # r = 2, the grid's worst-fitting r: the same MuonH slice, and a second seed at 0.056
  for lr in 0.028 0.056 0.112; do echo "r2_lrnorm0.15_lr$lr --r 2 --lr-norm 0.15 --lr-matrix $lr --scale 0.25"; done
  echo "r2_lrnorm0.15_lr0.056_seed1 --r 2 --lr-norm 0.15 --lr-matrix 0.056 --seed 1 --scale 0.25"
  # r = 2 and r = 4 were best at the lowest MuonH LR tried (0.014): one step lower brackets it
  for r in 2 4; do echo "r${r}_lrnorm0.15_lr0.007 --r $r --lr-norm 0.15 --lr-matrix 0.007 --scale 0.25"; done
}
if [ "${1:-}" = --list ]; then plan; exit 0; fi
plan | bash dev/micro_runs.sh
python3 dev/diagnose_report.py "$RESULTS"
