#!/usr/bin/env bash
# One ablation at CPU scale, in one command: a variant of the cpu-micro grid (train.py flags), trained only
# where it differs from the committed base (sweep.sh --variant reuses every committed run with its identity:
# here the r = 1 runs, which no injection or loop flag changes), then its answer (dev/ablation_report.py):
# the paired table against the base next to the noise of retraining and reseeding, delta-phi with its 95% CI
# on the layout-matched and on the plain r = 1, and a figure of the differences over a retrain's noise.
#
#   bash dev/ablate.sh gated -- --injection gated           # the full arm: the 42 looped runs of cpu-micro
#   bash dev/ablate.sh gated --quick -- --injection gated   # r = 4 at 1.1e12 and 2.4e12 (7 runs): the paired table
#   bash dev/ablate.sh rsi --quick --plan -- --random-state-init   # the plan only: nothing is trained or written
#   bash dev/ablate.sh gated --quick --seeds 3 -- --injection gated  # 3 seeds: a verdict with a narrower CI
#   bash dev/ablate.sh gated --quick --quiet --seeds 3 -- --injection gated  # on the quiet recipe: ±0.012-0.017
#   bash dev/ablate.sh gated --quick --quiet --paired-init --seeds 3 -- --injection gated  # shared initial draws
#   bash dev/ablate.sh trunc --quiet --grid cpu-micro-trunc --   # a case study's per-r flags (r_bwd = ceil(r/2))
#
# --seeds K trains K replicates of the arm: replicate i of the variant with its own --seed (default 0) + i into
# OUT-seed<i> (OUT itself for i = 0), and of the base with --seed i into BASE-seed<i> (BASE itself for i = 0; a
# base replicate trained once is reused by every later ablation), looped runs only: the verdict pairs them by
# cell and replicate, the base's other seeds a control where it has more (the quiet base: 11;
# nanoloop/verdict.py), the fits use replicate 0.
# --quiet trains both arms on the quiet CPU recipe (sweep.sh's CPU_QUIET_FLAGS: warmup and cosine decay, the
# last 20% of the weights averaged, MuonH LR 0.014; half the seed noise of the grid's recipe at a lower loss,
# dev/README.md "The noise and the quiet recipe"). Its base is dev/results/cpu-micro-quiet (and -quiet-layout,
# the layout-matched anchor), trained at the arm's cells the first time an ablation needs them, then reused;
# the default base is the committed cpu-micro (and cpu-micro-layout).
# --paired-init trains both arms with train.py --init-draws by-name: each weight's initial draw from a generator
# seeded by the seed and its name, so a variant that adds or drops a module (gated injection drops W_inj) starts
# every module it shares exactly as its base does, where from the one global RNG it starts from another draw, as a
# new seed would (common random numbers: the pairs share their start). Its base is BASE-byname
# (dev/results/cpu-micro-quiet-byname with --quiet), trained once as --quiet's is, then reused. Measured on gated
# injection at 3 seeds: ±0.015, as without it (dev/README.md, "Common initial draws").
#
# --grid GRID gives the variant (and its replicates) the runs of a case-study grid instead of cpu-micro's: its cells
# with the flags it sets per r, cpu-micro-trunc (--r-bwd ceil(r/2), and one wider width at 1.1e12 and 2.4e12) or
# cpu-micro-hyper (hyperconnections, K = 2); then the flags after -- may be none (--quiet's recipe alone makes the arm).
# The base stays cpu-micro's (or --quiet's) runs; the verdict pairs the cells both arms have.
# --plan lists every run of the arm: the flags it gets, what train.py will do with it (reuse which committed run
# of the same run identity, dev/results/*/runs/<name>/final.json, or train it) and, for a run to train, a time at
# the median achieved FLOP/s of the committed cpu-micro rows trained the same way at its r and width (trained on
# other machines: a guide, not a measurement of this one); then the totals. It needs the grid's data
# (data/micro-2k, which the ablation itself builds first).
# The flags are checked before anything is written, one line and exit 2 for: train.py's --help, a flag train.py
# refuses, a flag the grid sets per run (--r, --scale, --flops, --out, ...), a model some run refuses, and an OUT
# (or a replicate's folder) whose runs were trained with other flags (give the ablation another NAME). A loop flag
# that means nothing at r = 1 (flops.ModelConfig refuses it for the plain r = 1 stack: --random-state-init,
# --r-bwd 2, --untied) is not given to the r = 1 runs, which stay the base's own (sweep.sh --r1-flags); the plan
# says so.
# OUT (default dev/results/cpu-micro-NAME, -quick for --quick) holds the rows, logs, run folders and fit/:
# compare.json / compare_layout.json (fit_laws.py --compare against each anchor), ablation.txt, ablation.png.
# Until the report is written OUT holds a file INCOMPLETE (how it started, and how it failed if it did): a folder
# with it is not a result, dev/ablation_report.py refuses it, and fit/ablation.txt appears only at the end. Rerun
# the same command to finish a failed or stopped ablation: every finished run is kept.
# --quick fits its delta-phi on the same cells of the base (fit/base.jsonl, fit/layout.jsonl) without a
# bootstrap, from 100 random starts: one looped r at two budgets does not identify phi, so its answer is the
# paired table.
# Its runs train with --compile (not part of a run's identity): on CPU it compiles each block, a few seconds a
# run once inductor's cache holds a width, for 1.1-1.6x the eager step (dev/bench_train.py).
# Environment: CPU_JOBS (default 2), PYTHON, OUT, COMPILE (default 1; 0 trains eagerly).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: bash dev/ablate.sh NAME [--quick] [--quiet] [--paired-init] [--plan] [--seeds K] [--grid GRID] -- TRAIN_FLAGS (--help says more)"
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then
  echo "usage: bash dev/ablate.sh NAME [--quick] [--quiet] [--paired-init] [--plan] [--seeds K] [--grid GRID] -- TRAIN_FLAGS"
  sed -n '2,/^set /{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
[ $# -ge 1 ] && [[ "$1" != -* ]] || { echo "ablate.sh: $usage" >&2; exit 2; }
COMMAND="bash dev/ablate.sh $*"
NAME="$1"; shift
# the name goes into OUT and sweep.sh's --variant, which takes these characters
[[ "$NAME" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "ablate.sh: NAME '$NAME': use letters, digits, . _ - ($usage)" >&2; exit 2; }
QUICK=""
QUIET=""
PAIRED=""
PLAN=""
CHECK_ONLY=""  # plan_arm for the check before training: no output unless a run is refused
SEEDS=1
ARM_GRID=cpu-micro  # --grid: the sweep.sh grid whose runs the variant trains
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  case "$1" in
    --quick) QUICK=1; shift ;;
    --quiet) QUIET=1; shift ;;
    --paired-init) PAIRED=1; shift ;;
    --plan) PLAN=1; shift ;;
    --seeds)
      if ! [[ "${2:-}" =~ ^[1-9][0-9]*$ ]]; then
        echo "ablate.sh: --seeds takes a positive integer, got '${2:-}' ($usage)" >&2
        exit 2
      fi
      SEEDS="$2"; shift 2 ;;
    --grid)
      case "${2:-}" in
        cpu-micro|cpu-micro-trunc|cpu-micro-hyper) ARM_GRID="$2"; shift 2 ;;
        *) echo "ablate.sh: --grid takes cpu-micro, cpu-micro-trunc or cpu-micro-hyper, got '${2:-}' ($usage)" >&2
           exit 2 ;;
      esac ;;
    *) echo "ablate.sh: unknown option $1 before -- ($usage)" >&2; exit 2 ;;
  esac
done
[ "${1:-}" = -- ] || { echo "ablate.sh: the train.py flags that make the variant go after -- ($usage)" >&2; exit 2; }
shift
if [ $# -eq 0 ] && [ "$ARM_GRID" = cpu-micro ]; then
  echo "ablate.sh: the train.py flags that make the variant go after -- ($usage)" >&2
  exit 2
fi
BASE_DIR=dev/results/cpu-micro  # the base's replicate 0; BASE_DIR-layout its layout-matched anchor
RECIPE_FLAGS=()                 # --quiet: the recipe of both arms, before the variant's own flags (a later flag wins)
if [ -n "$QUIET" ]; then
  read -ra RECIPE_FLAGS <<< "$(sed -n 's/^CPU_QUIET_FLAGS="\(.*\)"$/\1/p' sweep.sh)"
  [ "${#RECIPE_FLAGS[@]}" -gt 0 ] || { echo "ablate.sh: CPU_QUIET_FLAGS not found in sweep.sh" >&2; exit 2; }
  BASE_DIR=dev/results/cpu-micro-quiet
fi
if [ -n "$PAIRED" ]; then
  RECIPE_FLAGS+=(--init-draws by-name)
  BASE_DIR="$BASE_DIR-byname"
fi
BASE_VARIANT="${BASE_DIR#dev/results/cpu-micro-}"  # quiet, byname or quiet-byname: sweep.sh's --variant for it
set -- "${RECIPE_FLAGS[@]}" "$@"
if [ $# -eq 0 ]; then  # --grid's runs as committed: that grid's folder is the arm already
  echo "ablate.sh: --grid $ARM_GRID with no flags after -- is dev/results/$ARM_GRID itself (python" \
       "dev/ablation_report.py dev/results/$ARM_GRID reports it): add --quiet or the flags of a variant of it" >&2
  exit 2
fi
OWN_SEED=0  # the variant's own --seed (train.py's last one wins), from which its replicates count
args=("$@")
for ((k = 0; k < ${#args[@]}; k++)); do
  case "${args[k]}" in
    --seed) OWN_SEED="${args[k + 1]:-0}" ;;
    --seed=*) OWN_SEED="${args[k]#--seed=}" ;;
  esac
done
[[ "$OWN_SEED" =~ ^[0-9]+$ ]] || { echo "ablate.sh: --seed $OWN_SEED: a seed is a non-negative integer" >&2; exit 2; }
PYTHON="${PYTHON:-python3}"
CPU_JOBS="${CPU_JOBS:-2}"
OUT="${OUT:-dev/results/cpu-micro-$NAME${QUICK:+-quick}${QUIET:+-quiet}${PAIRED:+-byname}}"
COMPILE_FLAG=(--compile)
if [ "${COMPILE:-1}" = 0 ]; then COMPILE_FLAG=(); fi
BASE="$BASE_DIR/results.jsonl"
LAYOUT="$BASE_DIR-layout/results.jsonl"
REPORT_FLAGS=(--base "$BASE_DIR")
if [ -n "$QUIET" ]; then REPORT_FLAGS+=(--noise-recipe cosine-avg-lr014); fi  # dev/noise.sh's name for it
SUBSET=()
REPLICATE_SUBSET=(--r "2 4 8")  # replicates 1.. are for the verdict, which pairs the looped runs only
FIT_FLAGS=()
if [ -n "$QUICK" ]; then
  # One looped r at the middle budgets, whose best widths lie inside the grid (d = 16-24): 7 runs, the
  # paired table's answer in minutes.
  SUBSET=(--budgets "1.1e12 2.4e12" --r "1 4")
  REPLICATE_SUBSET=(--budgets "1.1e12 2.4e12" --r 4)
  # Its delta-phi is a point estimate, so its fits search from 100 random starts, not the protocol's 500: on
  # the committed quick arm every joint fit's phi is the 500-start one to 4 digits, and the fits and report
  # take 29 s instead of 159 s; one restricted (phi = 1) fit in compare.txt stops at a slightly worse optimum.
  FIT_FLAGS=(--bootstrap 0 --restarts 100)
fi

# The flags, checked on every run of the arm before anything is written, and those the r = 1 runs take (GPUS=0:
# the grid's commands as a CPU machine runs them).
R1_FLAGS=$(GPUS=0 OUT="$OUT" ./sweep.sh --grid "$ARM_GRID" --print "${SUBSET[@]}" |
           "$PYTHON" dev/ablation_report.py "$OUT" --r1-flags -- "$@")
R1_FLAGS="$R1_FLAGS${COMPILE_FLAG[*]:+ ${COMPILE_FLAG[*]}}"
VARIANT_FLAGS=("$@")
train_arm() {  # DIR GRID VARIANT [sweep.sh options] -- TRAIN_FLAGS: one arm's runs into DIR (sweep.sh reuses)
  local dir="$1" grid="$2" variant="$3"
  shift 3
  CPU_JOBS="$CPU_JOBS" OUT="$dir" ./sweep.sh --grid "$grid" --variant "$variant" --no-fit "$@" "${COMPILE_FLAG[@]}"
}
plan_arm() {  # the same arguments: every run train_arm would give train.py, and what train.py will do with it
  local dir="$1" grid="$2" variant="$3" options=()
  shift 3
  while [ "$1" != -- ]; do options+=("$1"); shift; done
  shift
  if [ -z "$CHECK_ONLY" ]; then echo; echo "$dir (sweep.sh --grid $grid --variant $variant ${options[*]}):"; fi
  GPUS=0 OUT="$dir" ./sweep.sh --grid "$grid" --variant "$variant" --print "${options[@]}" -- "$@" "${COMPILE_FLAG[@]}" |
    "$PYTHON" dev/ablation_report.py "$dir" --plan --slots "$CPU_JOBS" ${TALLY:+--tally "$TALLY"} \
      ${CHECK_ONLY:+--check} -- "$@"
}
every_arm() {  # ACTION (train_arm or plan_arm) on every arm of the ablation, in the order they train
  local i seed
  if [ -n "$QUIET$PAIRED" ]; then  # the base of that recipe and its layout-matched anchor (the looped runs reused)
    "$1" "$BASE_DIR" cpu-micro "$BASE_VARIANT" "${SUBSET[@]}" -- "${RECIPE_FLAGS[@]}"
    "$1" "$BASE_DIR-layout" cpu-micro-layout "$BASE_VARIANT" "${SUBSET[@]}" -- "${RECIPE_FLAGS[@]}"
  fi
  "$1" "$OUT" "$ARM_GRID" "$NAME" "${SUBSET[@]}" --r1-flags "$R1_FLAGS" -- "${VARIANT_FLAGS[@]}"
  for ((i = 1; i < SEEDS; i++)); do  # the other replicates: the base's (reused once trained), then the variant's
    seed=$((OWN_SEED + i))
    "$1" "$BASE_DIR-seed$i" cpu-micro "base-seed$i" "${REPLICATE_SUBSET[@]}" -- "${RECIPE_FLAGS[@]}" --seed "$i"
    "$1" "$OUT-seed$i" "$ARM_GRID" "$NAME-seed$i" "${REPLICATE_SUBSET[@]}" --r1-flags "$R1_FLAGS --seed $seed" \
      -- "${VARIANT_FLAGS[@]}" --seed "$seed"
  done
}
if [ -n "$PLAN" ]; then
  echo "ablate.sh $NAME${QUICK:+ --quick}${QUIET:+ --quiet}${PAIRED:+ --paired-init}: the plan into $OUT (CPU_JOBS=$CPU_JOBS," \
       "COMPILE=${COMPILE:-1}); nothing is trained or written"
  if [ -f "$OUT/INCOMPLETE" ]; then
    echo "  $OUT is an unfinished ablation (its INCOMPLETE file says how it stopped); running it finishes it"
  fi
  TALLY=$(mktemp)  # each arm's runs to train and time, for the total (outside the repository: nothing written)
  trap 'rm -f "$TALLY"' EXIT
  every_arm plan_arm
  echo
  "$PYTHON" dev/ablation_report.py "$OUT" --power "$SEEDS" ${QUICK:+--quick} "${REPORT_FLAGS[@]}" \
    --slots "$CPU_JOBS" --tally "$TALLY"
  exit 0
fi

# A rerun with other flags than OUT's runs were trained with would be refused run by run, after the report below
# is removed: every arm is checked first (the plan's "refused"), one line and exit 2, nothing written.
CHECK_ONLY=1
every_arm plan_arm
CHECK_ONLY=""
# From here on OUT says it is not a result until the report is written (dev/ablation_report.py refuses it).
mkdir -p "$OUT/fit"
echo "$COMMAND: started $(date -u +%FT%TZ); not finished (running, failed or stopped). Rerun the same command to" \
     "finish it: every finished run is kept." > "$OUT/INCOMPLETE"
rm -f "$OUT/fit/ablation.txt" "$OUT/fit/ablation.png"
mark_failed() {  # on any exit but success: the marker says how it stopped (and is there again after the report)
  local status=$?
  if [ "$status" -ne 0 ]; then
    echo "$COMMAND: failed (exit $status) at $(date -u +%FT%TZ)" >> "$OUT/INCOMPLETE"
  fi
}
trap mark_failed EXIT
start=$(date +%s)
every_arm train_arm
trained=$(date +%s)
if [ -n "$QUICK" ]; then  # the base on the variant's cells only, so that both arms have the same design
  "$PYTHON" dev/ablation_report.py "$OUT" --same-cells "$BASE" > "$OUT/fit/base.jsonl"
  "$PYTHON" dev/ablation_report.py "$OUT" --same-cells "$LAYOUT" > "$OUT/fit/layout.jsonl"
  BASE="$OUT/fit/base.jsonl"
  LAYOUT="$OUT/fit/layout.jsonl"
fi
VARIANT="$OUT/results.jsonl"
LAYOUT_VARIANT="$OUT/fit/layout_anchored.jsonl"
# An arm whose runs trained untied (whatever spelling of the flag train.py took) is an anchor: untied loops share
# nothing, so both comparisons fit the base's looped runs against it. Its rows file is empty for any other arm.
"$PYTHON" dev/ablation_report.py "$OUT" --untied-anchored-rows "$BASE" > "$OUT/fit/untied_anchored.jsonl"
if [ -s "$OUT/fit/untied_anchored.jsonl" ]; then
  VARIANT="$OUT/fit/untied_anchored.jsonl"
  LAYOUT_VARIANT="$VARIANT"
else
  rm "$OUT/fit/untied_anchored.jsonl"
  "$PYTHON" dev/ablation_report.py "$OUT" --layout-anchored-rows "${REPORT_FLAGS[@]}" > "$LAYOUT_VARIANT"
fi
"$PYTHON" fit_laws.py "$BASE" --compare "$VARIANT" "${FIT_FLAGS[@]}" --json "$OUT/fit/compare.json" \
  > "$OUT/fit/compare.txt"
"$PYTHON" fit_laws.py "$LAYOUT" --compare "$LAYOUT_VARIANT" "${FIT_FLAGS[@]}" \
  --json "$OUT/fit/compare_layout.json" > "$OUT/fit/compare_layout.txt"
# The report refuses a folder marked INCOMPLETE; the EXIT trap marks it again if the report fails, and
# fit/ablation.txt is renamed into place only once it is whole.
rm "$OUT/INCOMPLETE"
REPORT="$OUT/fit/ablation.txt.partial"
"$PYTHON" dev/ablation_report.py "$OUT" "${REPORT_FLAGS[@]}" | tee "$REPORT"
if [ -n "$QUICK" ]; then
  echo "(--quick: one looped r at two budgets does not identify phi; its delta-phi is a point estimate without a CI)" |
    tee -a "$REPORT"
fi
echo "ablate.sh $NAME: trained in $(( (trained - start) / 60 )) min, fits and report in $(( $(date +%s) - trained )) s" |
  tee -a "$REPORT"
mv "$REPORT" "$OUT/fit/ablation.txt"
