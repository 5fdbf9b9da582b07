#!/usr/bin/env bash
# sweep.sh — plan, run, resume and fit an iso-depth grid (paper §4.1, Table 7; fits §4.2-4.3).
#
#   ./sweep.sh --grid paper --plan                     # every run, its FLOPs, tokens, the total, the data check
#   ./sweep.sh --grid paper                            # run it on this node's GPUs, then fit
#   ./sweep.sh --grid paper --print > jobs.txt         # one command per line, for a scheduler
#   ./sweep.sh --grid cpu-micro                        # the CPU-scale study (~1.6 h, 2 cores)
#   ./sweep.sh --grid smoke -- --eval-rows 32          # anything after -- goes to every train.py
#   ./sweep.sh --grid cpu-micro --variant gated -- --injection gated   # a named variant: OUT runs/cpu-micro-gated,
#                                                      # runs it shares with a finished grid are reused, not retrained
#   ./sweep.sh --grid cpu-micro --variant rsi --r1-flags "" -- --random-state-init   # r = 1 runs get "" instead:
#                                                      # a loop flag that means nothing there (dev/ablate.sh decides)
#   ./sweep.sh --grid cpu-micro --budgets "5e11 5e12" --r "1 4"        # a subset of a grid's budgets and loop counts
#   ./sweep.sh --grids                                 # the grid names
#   ./sweep.sh --grid paper --slurm                    # submit the runs not done as a SLURM array, the fit after it
#   ./sweep.sh --grid paper --status                   # every run: done, running, queued, failed; FLOPs done, ETA
#
# Grids (GRIDS below; plan_lines says what each runs): paper (Table 7, 116 runs), trunc and hyper (the case
# studies at the four lowest budgets, reusing paper's r = 1 runs), depth18, depth24 (App. G.4), the CPU-scale
# cpu-micro and its case studies (-trunc, -hyper, -layout, -lr, -seeds), smoke (a chain check: runs of a few
# steps, whose fit means nothing).
#
# train.py is called for every planned run and decides from the results file whether the run is
# already done (same run identity), restores a finished run's missing row from its final.json,
# reuses a finished identical run of another grid beside OUT (--reuse-from: the r = 1 baselines that
# trunc/hyper share with paper; a variant also offers the committed CPU grids in dev/results, whose run
# folders keep their final.json), resumes a checkpoint, or trains. A failing run is logged and the others go on; a run locked by another live process is
# counted as busy. Before any run starts, the plan is priced by flops.py and refused when the
# prepared data holds fewer training tokens than the largest run reads (ALLOW_REPEAT=1 overrides).
#
# Environment: GPUS (default: all visible, 0 on CPU), GPUS_PER_RUN (default: GPUS, at least 1),
# CPU_JOBS (runs at once without GPUs, default 1; each gets cores/CPU_JOBS threads),
# OUT (default runs/<grid>), DATA (default per grid; the CPU grids and smoke build theirs from data/ when
# it is missing), PYTHON (default python3), ALLOW_REPEAT=1, WANDB_PROJECT (every run also logs to this Weights
# & Biases project, grouped by grid: train.py --wandb; needs requirements-dev.txt).
# With --slurm: GPUS_PER_RUN (GPUs per node of a run, default 0: CPU), NODES_PER_RUN (default 1),
# MAX_RUNNING (array tasks at once, default no limit), SBATCH_ARGS (more sbatch options) and sbatch's own
# SBATCH_PARTITION, SBATCH_ACCOUNT, SBATCH_QOS, SBATCH_TIMELIMIT, SBATCH_GRES, ... (dev/README.md).
set -uo pipefail
cd "$(dirname "$0")"

# ---------------------------------------------------------------------------------------------
# The grids, as data: their names (the one list), then their cells. A cell is "budget:widths"; widths s give d = 64 s.
GRIDS="paper trunc hyper depth18 depth24 truncate-or-not cpu-micro cpu-micro-trunc cpu-micro-hyper cpu-micro-layout cpu-micro-lr cpu-micro-seeds cpu-truncate-or-not cpu-untied smoke"
PAPER_CELLS=(            # Table 7: 29 (budget, width) cells, the same widths for every r
  "4.64e17:6 8 10 12"
  "1e18:6 8 10 12 14"
  "2.15e18:8 10 12 14 16"
  "4.64e18:10 12 14 16 18 20"
  "1e19:12 16 18 20 24"
  "2.15e19:18 24 28 34"
)
CASE_STUDY_CELLS=("${PAPER_CELLS[@]:0:4}")   # trunc, hyper, depth18/24: the four lowest budgets
# The authors' case-study sweeps add one wider width where the optimum moves wider (their released
# scaling_laws_truncbptt.sh / _hyperconnect.sh): for the looped runs only, since the r = 1 baseline is
# the unchanged paper runs. trunc: 20 r = 1 + 3 x 23 = 89 runs; hyper: 20 + 3 x 21 = 83 (App. H.2).
TRUNC_EXTRA_CELLS=("1e18:16" "2.15e18:18" "4.64e18:22")
HYPER_EXTRA_CELLS=("2.15e18:18")
# CPU scale: vocab 2048, rows of 128 tokens, 2,048-token steps, head dim 8 so d = 8..64 works
# (s = 0.125 is d = 8). Four budgets over 10x (the diagnostics' design, dev/README.md): widths around
# the optimum, widened where the first pass found it at the widest (d = 24 at 2.4e12, d = 32 at 5e12),
# so every minimum has a narrower and a wider width beside it, except at 5e11, where every r is best
# at d = 8, the one-head model (kept for the 10x span). Small models are dispatch-bound (~0.13-0.37 s
# a step), so a run's time follows its step count: 194 run-minutes, ~97 min on 2 cores (CPU_JOBS=2).
# cpu-micro-trunc / -hyper run the case studies on these cells and reuse cpu-micro's r = 1 runs;
# cpu-micro-layout is the layout-matched anchor: r = 1 in the looped layout (prelude 2 + a 16-layer
# block run once with linear injection + coda 2), with cpu-micro's looped runs reused.
CPU_MICRO_CELLS=(
  "5e11:0.125 0.25 0.375"
  "1.1e12:0.125 0.25 0.375"
  "2.4e12:0.125 0.25 0.375 0.5"
  "5e12:0.25 0.375 0.5 0.75"
)
# Truncated BPTT trains on more tokens per FLOP; two of its optima fell on the widest width (r = 2 at
# 1.1e12, r = 8 at 2.4e12), so the trunc grid adds a wider one there for its looped runs (d = 32 and
# d = 40, as TRUNC_EXTRA_CELLS does on GPU). Likewise hyperconnections' r = 4 at 1.1e12 (d = 32).
CPU_TRUNC_EXTRA_CELLS=("1.1e12:0.5" "2.4e12:0.625")
CPU_HYPER_EXTRA_CELLS=("1.1e12:0.5")
# cpu-micro-lr gives each r its own MuonH base LR: the diagnostics' LR check (dev/README.md) found r = 2
# and r = 4 best at 0.014 where r = 1 and r = 8 are best at the grid's 0.056 (at one cell; across the grid
# it changes r = 2 and 4 by no more than their seed noise). r = 1 and r = 8 are reused.
CPU_MICRO_LR_PER_R=("2:0.014" "4:0.014")
# cpu-micro-seeds repeats, with seed 1, each r's best width at the largest budget in cpu-micro (its
# committed seed-0 rows: d = 32, 24, 24, 32): the run-to-run spread of validation and downstream losses
# that the paper judges with three seeds at its largest budget (App. I, Table 10). One more seed, not two:
# these four runs take ~30 min on 2 cores; add seeds here ("1 2") for more. "budget:r:width".
CPU_MICRO_SEED_RUNS=("5e12:1:0.5" "5e12:2:0.375" "5e12:4:0.375" "5e12:8:0.5")
CPU_MICRO_SEEDS="1"
SMOKE_CELLS=("3e9:0.25 0.5" "1e10:0.25 0.5")
PAPER_R="1 2 4 8"

# Truncate or Not?'s scaling suite (their §4.1, Table 2, App. F-G): fixed-N models, so a (T, B) setting changes the
# compute and not the model; T forward loops, the last B trained. Sizes "name:scale:prelude/recur/coda" (N and
# N_rec/N as Table 2: 57.8M 0.510 ... 918.7M 0.505). Budgets are target tokens in units of D0 = 2^30; the batch,
# the steps and the LR follow from them (--recipe truncate-or-not). [decision] The suite as the paper describes it:
# the ten core settings at every size and level, (8, 1) at the fitting levels, T = 16 with B in {1, 4, 8, 16} at
# 120M/240M/480M and 2, 4, 8 D0; fitting levels at ~9/18/37/74 tokens per parameter (1B: three, 64 D0 is past
# Table 13), test levels below and above them for the core settings (fit_laws.py tells fit from test by tokens
# per parameter). 355 configurations (the paper's five-size grid: 343).
TON_SIZES=("60M:12:2/4/2" "120M:16:2/5/2" "240M:20:3/6/3" "480M:26:3/7/4" "1B:34:4/8/4")
TON_FIT_LEVELS=("60M:0.5 1 2 4" "120M:1 2 4 8" "240M:2 4 8 16" "480M:4 8 16 32" "1B:8 16 32")
TON_TEST_LEVELS=("60M:0.25 8 16 32" "120M:0.5 16 32" "240M:1 32" "480M:2" "1B:4")
TON_CORE="1:1 2:1 2:2 4:1 4:2 4:3 4:4 8:2 8:4 8:8"
TON_FIT_EXTRA="8:1"
TON_T16_SIZES="120M 240M 480M"
TON_T16_LEVELS="2 4 8"
TON_T16="16:1 16:4 16:8 16:16"
# The same study at CPU scale (cpu-truncate-or-not): the in-repo micro-corpus, three fixed-N sizes in a 1/2/1 layout
# (d = 16, 24, 32, head dim 8: N = 13.0k, 29.1k, 51.6k, N_rec/N 0.52), the ten core settings. D0 = 2^18 tokens and
# 16 sequences of 128 tokens at D0 keep Table 13's shape: 88-1,024 steps of 1,536-8,192 tokens. Fitting levels at
# ~10/20/40/80 tokens per parameter, one test level below each size's and one above the smallest's.
CPU_TON_SIZES=("d16:0.25:1/2/1" "d24:0.375:1/2/1" "d32:0.5:1/2/1")
CPU_TON_FIT_LEVELS=("d16:0.5 1 2 4" "d24:1 2 4 8" "d32:2 4 8 16")
CPU_TON_TEST_LEVELS=("d16:0.25 8" "d24:0.5" "d32:1")
# Their Table 12 at CPU scale (cpu-untied): at ~18 tokens per parameter of the (2, 2) model, the untied model (each
# loop its own block, W_inj and norm), (2, 2) at its width and (2, 2) widened to ~80% of its parameters (the width
# whose head dim, even for RoPE, is nearest 8), seeds 0-2. "size:level:wider width:its head dim"; seed 0 of (2, 2)
# is cpu-truncate-or-not's run of that name, reused.
CPU_UNTIED_RUNS=("d16:1:18:6" "d24:2:28:4" "d32:4:36:6")
CPU_UNTIED_SEEDS="0 1 2"

# Train flags per grid (model shape, data, LR re-anchoring for the CPU scale).
# The GPU grids evaluate every run on the paper's 34,560 validation rows (~70.8M tokens, §4.1).
# The LR rule is re-anchored at the micro reference (d = 32, B = 2048, D = 5e5, as App. E anchors the paper at s = 10) with the
# MuonH base LR 0.056 from dev/calibrate_micro_lr.sh (best for r = 1, 2nd-best of six for r = 4, see
# dev/results/lr_calibration.txt); the exponents and AdamW bases stay the paper's.
GPU_FLAGS="--eval-rows 34560"
CPU_MICRO_FLAGS="--head-dim 8 --batch-tokens 2048 --ref-width 32 --ref-batch 2048 --ref-tokens 5e5 --lr-matrix 0.056 --lr-norm 0.15 --eval-rows 1024 --log-every 50"
# The quiet CPU recipe (dev/ablate.sh --quiet), added after the grid's flags: warmup 10%, cosine decay, the
# last 20% of the weights averaged and evaluated, MuonH base LR 0.014. At the quick cell (r = 4, d = 16,
# 1.1e12; dev/noise.sh, 5 seeds) seed sd 0.023 nats at mean 5.188 against the grid recipe's 0.055 at 5.253.
CPU_QUIET_FLAGS="--warmup-frac 0.1 --lr-decay cosine --average-last 0.2 --lr-matrix 0.014"
TON_FLAGS="--recipe truncate-or-not $GPU_FLAGS"
CPU_TON_FLAGS="--recipe truncate-or-not --d0 262144 --batch-at-d0 16 --head-dim 8 --seq-len 128 --ref-width 32 --ref-batch 2048 --ref-tokens 5e5 --lr-matrix 0.056 --lr-norm 0.15 --eval-rows 1024 --log-every 50"
SMOKE_FLAGS="--head-dim 8 --depth 6 --prelude 1 --coda 1 --batch-tokens 512 --ref-width 32 --ref-batch 512 --ref-tokens 2e4 --eval-rows 64 --log-every 10"

# ---------------------------------------------------------------------------------------------
GRID="${GRID:-paper}"
MODE=run
EXTRA=()
VARIANT=""
BUDGETS=""
RS=""
R1_SET=""     # --r1-flags given: the r = 1 runs get R1_EXTRA in place of the flags after --
R1_EXTRA=""
while [ $# -gt 0 ]; do
  case "$1" in
    --grid|--flops-per-s|--variant|--budgets|--r|--r1-flags|--slurm-task) [ $# -ge 2 ] || { echo "sweep.sh: $1 needs a value" >&2; exit 2; } ;;&
    --grid) GRID="$2"; shift 2 ;;
    --plan) MODE=plan; shift ;;
    --print) MODE=print; shift ;;
    --grids) echo "$GRIDS" | tr ' ' '\n'; exit 0 ;;
    --variant) VARIANT="$2"; shift 2 ;;
    --budgets) BUDGETS="$2"; shift 2 ;;
    --r) RS="$2"; shift 2 ;;
    --r1-flags) R1_SET=1; R1_EXTRA="$2"; shift 2 ;;
    --slurm) MODE=slurm; shift ;;
    --status) MODE=status; shift ;;
    --slurm-task) MODE=slurm-task; TASKS_FILE="$2"; shift 2 ;;  # inside an array task (slurm_submit writes it)
    --slurm-fit) MODE=slurm-fit; shift ;;                       # inside the fit job after the array
    --flops-per-s) FLOPS_PER_S="$2"; shift 2 ;;
    --no-fit) NO_FIT=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,/^set /{/^#/p}' "$0"; exit 0 ;;
    *) echo "sweep.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ " $GRIDS " != *" $GRID "* ]]; then
  echo "sweep.sh: unknown grid '$GRID' (${GRIDS// /|})" >&2; exit 2
fi
if [ -n "$VARIANT" ]; then
  [[ "$VARIANT" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "sweep.sh: --variant '$VARIANT': use letters, digits, . _ -" >&2; exit 2; }
  [ "${#EXTRA[@]}" -gt 0 ] || { echo "sweep.sh: --variant $VARIANT needs the train.py flags that make it, after --" >&2; exit 2; }
fi
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-runs/$GRID${VARIANT:+-$VARIANT}}"
if [ -n "${WANDB_PROJECT:-}" ] && ! [[ "$WANDB_PROJECT" =~ ^[A-Za-z0-9._-]+$ ]]; then  # it goes into a command line
  echo "sweep.sh: WANDB_PROJECT='$WANDB_PROJECT' is not a wandb project name (letters, digits, '.', '_', '-')" >&2; exit 2
fi
RESULTS="$OUT/results.jsonl"

# values_for KEY "K:V"...: the Vs of the entries whose K is KEY (the extra widths of a budget, an r's LR).
values_for() { local key="$1" e out=""; shift; for e in "$@"; do [ "${e%%:*}" = "$key" ] && out="$out ${e#*:}"; done; echo "${out# }"; }

# The fixed-N (T, B) suite's lines (truncate-or-not, cpu-truncate-or-not): for each size and level, its settings.
# SETTINGS "T:B ..." at LEVEL (D/D0) of SIZE "name:scale:p/r/c"; the name holds size, setting and level.
fixed_n_lines() {  # size, "levels", "settings", flags, D0
  local name scale layout prelude recur coda level setting T B tokens
  IFS=: read -r name scale layout <<< "$1"
  IFS=/ read -r prelude recur coda <<< "$layout"
  for level in $2; do
    tokens=$(awk -v l="$level" -v d0="$5" 'BEGIN { printf "%.0f", l * d0 }')
    for setting in $3; do
      T="${setting%%:*}"; B="${setting#*:}"
      echo "${name}_T${T}B${B}_D${level}|--r $T --r-bwd $B --scale $scale --prelude $prelude --recur $recur --coda $coda --tokens $tokens $4"
    done
  done
}

truncate_or_not_lines() {  # the suite of the paper (truncate-or-not) or of the CPU (cpu-truncate-or-not)
  local size name
  if [ "$GRID" = cpu-truncate-or-not ]; then
    for size in "${CPU_TON_SIZES[@]}"; do
      name="${size%%:*}"
      fixed_n_lines "$size" "$(values_for "$name" "${CPU_TON_FIT_LEVELS[@]}") $(values_for "$name" "${CPU_TON_TEST_LEVELS[@]}")" "$TON_CORE" "$CPU_TON_FLAGS" 262144
    done
    return 0
  fi
  for size in "${TON_SIZES[@]}"; do
    name="${size%%:*}"
    fixed_n_lines "$size" "$(values_for "$name" "${TON_FIT_LEVELS[@]}")" "$TON_CORE $TON_FIT_EXTRA" "$TON_FLAGS" 1073741824
    fixed_n_lines "$size" "$(values_for "$name" "${TON_TEST_LEVELS[@]}")" "$TON_CORE" "$TON_FLAGS" 1073741824
    if [[ " $TON_T16_SIZES " == *" $name "* ]]; then
      fixed_n_lines "$size" "$TON_T16_LEVELS" "$TON_T16" "$TON_FLAGS" 1073741824
    fi
  done
}

untied_lines() {  # cpu-untied: for each size, seed: (2, 2), its untied model, (2, 2) wider; seed 0 unsuffixed
  local run name level wide head size seed suffix
  for run in "${CPU_UNTIED_RUNS[@]}"; do
    IFS=: read -r name level wide head <<< "$run"
    for size in "${CPU_TON_SIZES[@]}"; do [ "${size%%:*}" = "$name" ] && break; done
    for seed in $CPU_UNTIED_SEEDS; do
      suffix=""
      if [ "$seed" != 0 ]; then suffix="_seed$seed"; fi
      fixed_n_lines "$size" "$level" "2:2" "$CPU_TON_FLAGS --seed $seed" 262144 | sed "s/_D${level}|/_D${level}${suffix}|/"
      fixed_n_lines "$size" "$level" "2:2" "$CPU_TON_FLAGS --seed $seed --untied" 262144 | sed "s/_D${level}|/_D${level}_untied${suffix}|/"
      fixed_n_lines "$size" "$level" "2:2" "$CPU_TON_FLAGS --seed $seed --head-dim $head" 262144 |
        sed "s/^${name}_\(.*\)|\(.*\)--scale [^ ]*/w${wide}_\1${suffix}|\2--scale $(awk -v w="$wide" 'BEGIN { print w / 64 }')/"
    done
  done
}

# One line per run: name | train.py flags (without data/out/results).
plan_lines() {
  local cells=() extra=() rs="$PAPER_R" flags="$GPU_FLAGS" variant="" tag=""
  if [[ "$GRID" == *truncate-or-not ]]; then  # fixed-N sizes at token levels, not iso-depth cells
    truncate_or_not_lines
    return 0
  fi
  if [ "$GRID" = cpu-untied ]; then
    untied_lines
    return 0
  fi
  if [ "$GRID" = cpu-micro-seeds ]; then  # a list of runs, not cells: each r at its own width
    local run budget r s seed
    for run in "${CPU_MICRO_SEED_RUNS[@]}"; do
      IFS=: read -r budget r s <<< "$run"
      for seed in $CPU_MICRO_SEEDS; do
        echo "r${r}_s${s}_C${budget}_seed${seed}_micro|--r $r --scale $s --flops $budget $CPU_MICRO_FLAGS --seed $seed"
      done
    done
    return 0
  fi
  case "$GRID" in
    paper)     cells=("${PAPER_CELLS[@]}") ;;
    trunc)     cells=("${CASE_STUDY_CELLS[@]}"); extra=("${TRUNC_EXTRA_CELLS[@]}"); variant=trunc ;;
    hyper)     cells=("${CASE_STUDY_CELLS[@]}"); extra=("${HYPER_EXTRA_CELLS[@]}"); variant=hyper ;;
    depth18)   cells=("${CASE_STUDY_CELLS[@]}"); flags="--depth 18 --prelude 1 --coda 1 $GPU_FLAGS"; tag=_L18 ;;
    depth24)   cells=("${CASE_STUDY_CELLS[@]}"); flags="--depth 24 --prelude 4 --coda 4 $GPU_FLAGS"; tag=_L24 ;;
    cpu-micro*)
               cells=("${CPU_MICRO_CELLS[@]}"); flags="$CPU_MICRO_FLAGS"; tag=_micro; variant="${GRID#cpu-micro}"; variant="${variant#-}"
               if [ "$variant" = trunc ]; then extra=("${CPU_TRUNC_EXTRA_CELLS[@]}"); fi
               if [ "$variant" = hyper ]; then extra=("${CPU_HYPER_EXTRA_CELLS[@]}"); fi ;;
    smoke)     cells=("${SMOKE_CELLS[@]}"); flags="$SMOKE_FLAGS"; rs="1 2 4"; tag=_smoke ;;
  esac
  local cell budget s r more arch name lr
  for cell in "${cells[@]}"; do
    budget="${cell%%:*}"
    more=$(values_for "$budget" "${extra[@]}")  # the extra (wider) widths at this budget, looped runs only
    for s in ${cell#*:} $more; do
      for r in $rs; do
        if [ "$r" -eq 1 ] && [[ " $more " == *" $s "* ]]; then continue; fi
        # The name holds everything that makes a run distinct, so identical runs (the r = 1
        # baselines of the case studies) share a name across grids and can be reused.
        arch="--r $r"; name="r${r}_s${s}_C${budget}"; lr=""
        if [ "$r" -gt 1 ] && [ "$variant" = trunc ]; then
          arch="--r $r --r-bwd $(( (r + 1) / 2 ))"; name="${name}_rb$(( (r + 1) / 2 ))"
        elif [ "$r" -gt 1 ] && [ "$variant" = hyper ]; then
          arch="--r $r --injection hyper --hc-lanes 2"; name="${name}_hyper"
        elif [ "$r" -eq 1 ] && [ "$variant" = layout ]; then
          arch="--r 1 --recur 16 --injection linear"; name="${name}_layout"
        elif [ "$variant" = lr ]; then
          lr=$(values_for "$r" "${CPU_MICRO_LR_PER_R[@]}"); name="${name}${lr:+_lr$lr}"
        fi
        echo "$name$tag|$arch --scale $s --flops $budget $flags${lr:+ --lr-matrix $lr}"  # a later flag wins in train.py
      done
    done
  done
}

# Each grid's dataset: its default folder and the prepare_data.py flags that build it. The CPU grids and
# smoke read sources the repository ships (data/), so a missing $DATA is built before the first run
# (DATA_IN_REPO=1); the GPU grids download FineWeb-Edu (~2 GB a shard), which the sweep only names.
case "$GRID" in
  cpu-micro*|cpu-truncate-or-not|cpu-untied) DATA_DEFAULT=data/micro-2k; DATA_IN_REPO=1
              DATA_FLAGS="--source data/micro-corpus --vocab-size 2048 --seq-len 128 --val-fraction 0.02" ;;
  smoke)      DATA_DEFAULT=data/smoke; DATA_IN_REPO=1
              DATA_FLAGS="--source data/fineweb-edu-sample/shard_00000.parquet data/fineweb-edu-sample/shard_00001.parquet --val-shards 1 --vocab-size 512 --seq-len 64" ;;
  *)          DATA_DEFAULT=data/fineweb; DATA_IN_REPO=""; DATA_FLAGS="--shards 205" ;;
esac
DATA="${DATA:-$DATA_DEFAULT}"
data_command() { echo "prepare_data.py $DATA_FLAGS --out $DATA"; }

# A subset of the plan: the runs whose --flops is one of BUDGETS and whose --r is one of RS (as the grid writes
# them), or all of them. A value that no planned run has is refused: a typo must not quietly run nothing.
select_lines() {
  local line value kept=() budget_flag=--flops
  if [[ "$GRID" == *truncate-or-not ]]; then budget_flag=--tokens; fi  # token horizons: --budgets takes tokens
  for value in $BUDGETS; do planned_value "$budget_flag" "$value"; done
  for value in $RS; do planned_value --r "$value"; done
  for line in "${LINES[@]}"; do
    if [ -n "$BUDGETS" ] && [[ " $BUDGETS " != *" $(flag_value "$line" "$budget_flag") "* ]]; then continue; fi
    if [ -n "$RS" ] && [[ " $RS " != *" $(flag_value "$line" --r) "* ]]; then continue; fi
    kept+=("$line")
  done
  LINES=("${kept[@]}")
}
flag_value() { local rest=" ${1#*|} "; rest="${rest#* $2 }"; echo "${rest%% *}"; }  # LINE FLAG: FLAG's value
planned_value() {  # FLAG VALUE: exit 2 unless some planned run has FLAG VALUE
  local line
  for line in "${LINES[@]}"; do [ "$(flag_value "$line" "$1")" = "$2" ] && return 0; done
  echo "sweep.sh: grid $GRID has no run with $1 $2" >&2
  exit 2
}

mapfile -t LINES < <(plan_lines) || exit 2
select_lines
[ "${#LINES[@]}" -gt 0 ] || exit 2

# flops.py prices the plan (the single source of truth for N, D and FLOPs) and checks that the
# prepared data covers the largest run; the flags after -- can change the horizon, so they go along.
extra_for() {  # LINE: the flags after -- that its run gets; with --r1-flags, an r = 1 run gets those instead
  if [ -n "$R1_SET" ] && [ "$(flag_value "$1" --r)" = 1 ]; then
    echo "$R1_EXTRA"
  else
    echo "${EXTRA[*]}"
  fi
}
plan_with_extra() {  # the plan lines with the flags after -- (what each train.py is given)
  local line extra
  for line in "${LINES[@]}"; do extra=$(extra_for "$line"); echo "$line${extra:+ $extra}"; done
}
price_plan() {
  plan_with_extra | "$PYTHON" flops.py --plan --data "$DATA" --results "$RESULTS" ${FLOPS_PER_S:+--flops-per-s "$FLOPS_PER_S"}
}
if [ "$MODE" = plan ]; then
  price_plan
  exit $?
fi

# ---------------------------------------------------------------------------------------------
# What every mode that trains shares: train.py's arguments for a run, the data, the fit.
whole() { [[ "$2" =~ ^[0-9]+$ ]] || { echo "sweep.sh: $1 must be a whole number, got '$2'" >&2; exit 2; }; }

# Finished runs of the same name in other grids: beside OUT (runs/paper for runs/trunc) and, for a variant,
# the committed grids in dev/results too. train.py reuses the first whose identity is exactly this run's.
reuse_candidates() {
  local name="$1" dir sibling
  local dirs=("$(dirname "$OUT")")
  if [ -n "$VARIANT" ] && [ "$(realpath -m "$(dirname "$OUT")")" != "$(realpath -m dev/results)" ]; then
    dirs+=(dev/results)
  fi
  for dir in "${dirs[@]}"; do
    for sibling in "$dir"/*/runs/"$name"; do
      if [ -f "$sibling/final.json" ] && [ "$(realpath -m "$sibling/../..")" != "$(realpath -m "$OUT")" ]; then
        echo "$sibling"
      fi
    done
  done
}

train_args() {  # name, flags: train.py and its arguments for one run (what the launcher runs)
  local name="$1" flags="$2" reuse="" sibling extra
  for sibling in $(reuse_candidates "$name"); do reuse="$reuse--reuse-from $sibling "; done
  extra=$(extra_for "$name|$flags")
  local args="train.py --data $DATA --out $OUT/runs/$name --results $RESULTS --resume $reuse$flags${extra:+ $extra}"
  echo "$args${WANDB_PROJECT:+ --wandb $WANDB_PROJECT --wandb-group $GRID${VARIANT:+-$VARIANT}}"
}

ensure_data() {  # $DATA/meta.json, built from the repository's sources for the CPU grids and smoke
  if [ -f "$DATA/meta.json" ]; then
    return 0
  fi
  if [ -n "$DATA_IN_REPO" ]; then
    echo "sweep.sh: $DATA/meta.json not found; building it from the repository's data: $PYTHON $(data_command)"
    "$PYTHON" $(data_command) || exit 2
    return 0
  fi
  echo "sweep.sh: $DATA/meta.json not found; build it first: $PYTHON $(data_command)" \
       "(the paper grid's 205 shards; README 'Reproducing the paper' lists the other grids')" >&2
  exit 2
}

run_fit() {  # fit_laws.py over the results into $OUT/fit (report.txt, fit.json, plots); non-zero if it failed
  if [ "$GRID" = cpu-micro-seeds ] || [ "$GRID" = cpu-untied ]; then
    return 0  # no law to fit: dev/study_tables.py reads the seed spread, dev/untied_report.py the comparison
  fi
  mkdir -p "$OUT/fit"
  local law=iso-depth
  if [[ "$GRID" == *truncate-or-not ]]; then law=truncate-or-not; fi  # fixed-N (T, B) suites: their law
  if "$PYTHON" fit_laws.py "$RESULTS" --law "$law" --json "$OUT/fit/fit.json" --plots "$OUT/fit" > "$OUT/fit/report.txt" 2> "$OUT/fit/fit.err"; then
    cat "$OUT/fit/report.txt"
    return 0
  fi
  echo "sweep.sh: fit_laws.py failed (see $OUT/fit/fit.err):" >&2
  tail -n 3 "$OUT/fit/fit.err" >&2
  return 1
}

# ---------------------------------------------------------------------------------------------
# Status (--status): one table of every planned run from the results, run folders, logs and squeue.
# nanoloop/sweep_state.py holds the logic: it gives each plan line train.py's run identity, as train.py does.
status_main() {
  if [ ! -s "$RESULTS" ] && [ ! -f "$OUT/slurm/jobs.txt" ] && ! compgen -G "$OUT/runs/*" > /dev/null &&
     ! compgen -G "$OUT/logs/*.log" > /dev/null; then
    echo "sweep.sh: $OUT holds no sweep yet (no results, run folders, logs or submissions); start one with" \
         "./sweep.sh --grid $GRID [--slurm], or set OUT" >&2
    exit 2
  fi
  if [ ! -f "$DATA/meta.json" ]; then
    echo "sweep.sh: --status needs $DATA/meta.json: a run's identity depends on its data (set DATA)" >&2
    exit 2
  fi
  plan_with_extra | "$PYTHON" -m nanoloop.sweep_state --status --data "$DATA" --out "$OUT"
}

# ---------------------------------------------------------------------------------------------
# SLURM (--slurm): the runs not done as one array job, a task per run, then the fit in a job that waits
# for the whole array (afterany). Cluster settings are sbatch's own: the SBATCH_* input variables it
# reads itself (SBATCH_PARTITION, SBATCH_ACCOUNT, SBATCH_QOS, SBATCH_TIMELIMIT, SBATCH_GRES, ...) and
# SBATCH_ARGS for any other option. Tasks are requeueable and get SIGUSR1 two minutes before their time
# limit (--signal=B:USR1@120, unless SBATCH_SIGNAL says otherwise): train.py checkpoints, the task requeues
# itself and its next allocation resumes. A requeue or preemption by SLURM signals train.py directly.
slurm_settings() {  # GPUS_PER_RUN (per node; 0: CPU), NODES_PER_RUN, MAX_RUNNING: checked before any work
  GPUS_PER_RUN="${GPUS_PER_RUN:-0}"
  NODES_PER_RUN="${NODES_PER_RUN:-1}"
  whole GPUS_PER_RUN "$GPUS_PER_RUN"
  whole NODES_PER_RUN "$NODES_PER_RUN"
  if [ "$NODES_PER_RUN" -lt 1 ]; then
    echo "sweep.sh: NODES_PER_RUN must be >= 1, got $NODES_PER_RUN" >&2
    exit 2
  fi
  if [ -n "${MAX_RUNNING:-}" ]; then
    whole MAX_RUNNING "$MAX_RUNNING"
    if [ "$MAX_RUNNING" -lt 1 ]; then
      echo "sweep.sh: MAX_RUNNING must be >= 1, got $MAX_RUNNING" >&2
      exit 2
    fi
  fi
}

slurm_submit() {
  if ! command -v sbatch > /dev/null 2>&1; then
    echo "sweep.sh: --slurm needs SLURM's sbatch on PATH (run it on the cluster's login node)" >&2
    exit 2
  fi
  slurm_settings
  ensure_data
  mkdir -p "$OUT/runs" "$OUT/logs/slurm" "$OUT/slurm" || exit 2
  price_plan > "$OUT/plan.txt" || exit 2
  touch "$RESULTS"
  local device=cpu
  if [ "$GPUS_PER_RUN" -gt 0 ]; then
    device=cuda
  fi
  # Which runs are not done (train.py's run identity against the results), nor queued or running now.
  local ranks=$(( NODES_PER_RUN * (GPUS_PER_RUN > 0 ? GPUS_PER_RUN : 1) )) todo
  todo=$(plan_with_extra | "$PYTHON" -m nanoloop.sweep_state --todo --data "$DATA" --out "$OUT" --device "$device" --world "$ranks") || exit 2
  local tasks="$OUT/slurm/tasks-$(date -u +%Y%m%dT%H%M%SZ)-$$.txt" line n=0
  for line in "${LINES[@]}"; do
    if grep -qxF "${line%%|*}" <<< "$todo"; then
      echo "${line%%|*}|$(train_args "${line%%|*}" "${line#*|}") --device $device" >> "$tasks"
      n=$(( n + 1 ))
    fi
  done
  if [ "$n" -eq 0 ]; then
    echo "sweep.sh: nothing to submit: every run of $GRID is done, queued or running (./sweep.sh --grid $GRID --status)"
    exit 0
  fi
  slurm_sbatch "$tasks" "$n"
}

slurm_sbatch() {  # tasks file, how many: the array and the fit job after it, recorded in $OUT/slurm/jobs.txt
  local tasks="$1" n="$2" array fit
  local opts=(--parsable --job-name="nanoloop-$GRID" --array="0-$(( n - 1 ))${MAX_RUNNING:+%$MAX_RUNNING}"
              --requeue --open-mode=append --output="$OUT/logs/slurm/%A_%a.out"
              --nodes="$NODES_PER_RUN" --ntasks-per-node=1)
  if [ "$GPUS_PER_RUN" -gt 0 ] && [ -z "${SBATCH_GRES:-}" ]; then
    opts+=(--gpus-per-node="$GPUS_PER_RUN")
  fi
  if [ -z "${SBATCH_SIGNAL:-}" ]; then
    opts+=(--signal=B:USR1@120)
  fi
  # The job runs this very sweep.sh (not sbatch's spooled copy of a script): --wrap execs it by path.
  local task_cmd fit_cmd
  task_cmd=$(printf 'exec env OUT=%q DATA=%q PYTHON=%q GPUS_PER_RUN=%q bash %q --grid %q --slurm-task %q' \
             "$OUT" "$DATA" "$PYTHON" "$GPUS_PER_RUN" "$PWD/sweep.sh" "$GRID" "$tasks")
  # shellcheck disable=SC2086  # SBATCH_ARGS is a list of options
  array=$(sbatch "${opts[@]}" ${SBATCH_ARGS:-} --wrap "$task_cmd") || { echo "sweep.sh: sbatch refused the array" >&2; exit 1; }
  array="${array%%;*}"  # --parsable: "id" or "id;cluster"
  fit_cmd=$(printf 'exec env OUT=%q DATA=%q PYTHON=%q NO_FIT=%q bash %q --grid %q --slurm-fit' "$OUT" "$DATA" \
            "$PYTHON" "${NO_FIT:-}" "$PWD/sweep.sh" "$GRID")
  if [ -n "$R1_SET" ]; then
    fit_cmd="$fit_cmd --r1-flags $(printf %q "$R1_EXTRA")"
  fi
  fit_cmd="$fit_cmd --"
  if [ "${#EXTRA[@]}" -gt 0 ]; then
    fit_cmd="$fit_cmd$(printf ' %q' "${EXTRA[@]}")"  # the identities of the missing-runs report need them
  fi
  fit=$(sbatch --parsable --job-name="nanoloop-$GRID-fit" --dependency="afterany:$array" --gres=none \
        --nodes=1 --ntasks=1 --output="$OUT/logs/slurm/fit-%j.out" --wrap "$fit_cmd") ||
    { echo "sweep.sh: array job $array is submitted, but sbatch refused the fit job: run ./sweep.sh --grid $GRID --slurm-fit after it" >&2; fit=none; }
  fit="${fit%%;*}"
  echo "$array $fit $tasks" >> "$OUT/slurm/jobs.txt"
  echo "sweep.sh: submitted $n run(s) of $GRID as array job $array${MAX_RUNNING:+ (at most $MAX_RUNNING at once)}," \
       "the fit as job $fit after it; logs in $OUT/logs; watch with ./sweep.sh --grid $GRID --status"
  [ "$fit" != none ]
}

torchrun_launcher() {  # torchrun for this allocation: one agent per node, GPUS_PER_RUN workers each (1 on CPU)
  local per_node=$(( GPUS_PER_RUN > 0 ? GPUS_PER_RUN : 1 )) nodes="${SLURM_JOB_NUM_NODES:-1}"
  local torchrun="$PYTHON -m torch.distributed.run --nproc_per_node=$per_node"
  if [ "$nodes" -eq 1 ]; then
    echo "$torchrun --standalone"
    return
  fi
  # The rendezvous is on the first node, at the address SLURM reaches it by, on a port of this job's.
  local head addr
  head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
  addr=$(scontrol show node "$head" | grep -oE 'NodeAddr=[^ ]+' | cut -d= -f2)
  echo "$torchrun --nnodes=$nodes --rdzv-backend=c10d --rdzv-endpoint=${addr:-$head}:$(( 29500 + SLURM_JOB_ID % 1000 ))" \
       "--rdzv-id=$SLURM_JOB_ID"
}

task_outcome() {  # srun's status, what this attempt logged: train.py's own exit status (torchrun's is 1 for any)
  local rc="$1" said="$2" reported
  if [ "$rc" -eq 0 ]; then
    echo 0
  elif grep -q "train.py: interrupted at step" <<< "$said"; then
    echo 143
  elif grep -q "^busy: " <<< "$said"; then
    echo 75
  else
    reported=$(grep -oE 'exitcode *: *[0-9]+' <<< "$said" | head -n 1 | grep -oE '[0-9]+$')
    echo "${reported:-$rc}"
  fi
}

requeue_if_progressed() {  # after the time-limit signal: requeue, unless not one step was finished this time
  local said="$1" log="$2" from to
  from=$(grep -oE 'resumed .* at step [0-9]+' <<< "$said" | grep -oE '[0-9]+$' | tail -n 1)
  to=$(grep -oE 'interrupted at step [0-9]+' <<< "$said" | grep -oE '[0-9]+$' | tail -n 1)
  if [ "${to:-0}" -gt "${from:-0}" ]; then
    echo "sweep.sh: time limit near: requeued; the next allocation resumes at step $to" >> "$log"
    scontrol requeue "$TASK_ID" >> "$log" 2>&1
  else
    echo "sweep.sh: no step finished before the time-limit signal, so not requeued: raise SBATCH_TIMELIMIT" >> "$log"
  fi
}

slurm_task() {  # inside array task SLURM_ARRAY_TASK_ID: train line SLURM_ARRAY_TASK_ID + 1 of TASKS_FILE (srun + torchrun)
  local line name args log start launcher pid rc said code
  line=$(sed -n "$(( SLURM_ARRAY_TASK_ID + 1 ))p" "$TASKS_FILE")
  name="${line%%|*}"
  args="${line#*|}"
  log="$OUT/logs/$name.log"
  # This task by its array name: one task's SLURM_JOB_ID can be the array's own id, and scancel or
  # scontrol given that id act on every task of the array.
  TASK_ID="${SLURM_ARRAY_JOB_ID}_$SLURM_ARRAY_TASK_ID"
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"  # the CPUs SLURM gave the task
  launcher=$(torchrun_launcher)
  start=$(stat -c %s "$log" 2>/dev/null || echo 0)
  echo "[$(date -u +%FT%TZ)] slurm job $TASK_ID (restart ${SLURM_RESTART_COUNT:-0})" \
       "on $SLURM_JOB_NODELIST: $launcher -- $args" >> "$log"
  TIME_LIMIT_SIGNAL=""
  # The time-limit warning reaches this shell only: pass SIGTERM to every process of the job's steps, on
  # every node (train.py and torchrun, which forwards it too). A requeue, a preemption or scancel: SLURM
  # signals those processes itself, so this shell only waits for train.py's checkpoint.
  trap 'TIME_LIMIT_SIGNAL=1; scancel --signal=TERM "$TASK_ID"' USR1
  trap ':' TERM
  # "--" keeps torchrun's argparse from reading train.py's --r as its own (ambiguous) flag.
  srun --kill-on-bad-exit=1 $launcher -- $args >> "$log" 2>&1 &
  pid=$!
  wait "$pid"
  while kill -0 "$pid" 2> /dev/null; do  # a trapped signal ends wait early: wait again for srun itself
    wait "$pid"
  done
  wait "$pid"
  rc=$?
  said=$(tail -c +$(( start + 1 )) "$log")
  code=$(task_outcome "$rc" "$said")
  if [ "$code" -eq 143 ] && [ -n "$TIME_LIMIT_SIGNAL" ]; then
    requeue_if_progressed "$said" "$log"
  fi
  echo "[$(date -u +%FT%TZ)] exit $code" >> "$log"
  exit "$code"
}

slurm_fit() {  # the fit job, once every task of the array has ended: the fit, then the runs without a row
  local fit_status=0
  if [ -z "${NO_FIT:-}" ]; then
    run_fit || fit_status=1
  fi
  mkdir -p "$OUT/fit"
  plan_with_extra | "$PYTHON" -m nanoloop.sweep_state --missing --data "$DATA" --out "$OUT" | tee "$OUT/fit/missing.txt"
  exit "$fit_status"
}

case "$MODE" in
  status) status_main; exit $? ;;
  slurm) slurm_submit; exit $? ;;
  slurm-task) slurm_task ;;
  slurm-fit) slurm_fit ;;
esac

# ---------------------------------------------------------------------------------------------
# Running. GPU slots: GPUS / GPUS_PER_RUN concurrent runs, each on its own devices and port.
if [ -z "${GPUS:-}" ]; then
  GPUS=$(command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | wc -l || echo 0)
fi
whole GPUS "$GPUS"
GPUS_PER_RUN="${GPUS_PER_RUN:-$(( GPUS > 0 ? GPUS : 1 ))}"
whole GPUS_PER_RUN "$GPUS_PER_RUN"
whole CPU_JOBS "${CPU_JOBS:-1}"
if [ "$GPUS" -gt 0 ]; then
  [ "$GPUS_PER_RUN" -ge 1 ] && [ "$GPUS_PER_RUN" -le "$GPUS" ] ||
    { echo "sweep.sh: GPUS_PER_RUN=$GPUS_PER_RUN must be in 1..GPUS=$GPUS" >&2; exit 2; }
  SLOTS=$(( GPUS / GPUS_PER_RUN ))
else
  SLOTS="${CPU_JOBS:-1}"
  [ "$SLOTS" -ge 1 ] || { echo "sweep.sh: CPU_JOBS must be >= 1, got $SLOTS" >&2; exit 2; }
  # Tiny models are dispatch-bound: one thread per run and several runs beat oversubscribed threads.
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / SLOTS > 0 ? $(nproc) / SLOTS : 1 ))}"
fi

train_command() {  # name, flags, slot
  local slot="$3" common
  common=$(train_args "$1" "$2")
  if [ "$GPUS" -gt 0 ]; then
    local first=$(( slot * GPUS_PER_RUN )) devices
    devices=$(seq -s, "$first" $(( first + GPUS_PER_RUN - 1 )))
    # "--" keeps torchrun's argparse from reading train.py's --r as its own (ambiguous) flag.
    echo "CUDA_VISIBLE_DEVICES=$devices torchrun --standalone --nproc_per_node=$GPUS_PER_RUN -- $common"
  else
    echo "$PYTHON $common"
  fi
}

if [ "$MODE" = print ]; then
  for line in "${LINES[@]}"; do train_command "${line%%|*}" "${line#*|}" 0 | sed 's/^CUDA_VISIBLE_DEVICES=[^ ]* //'; done
  exit 0
fi

ensure_data
mkdir -p "$OUT/runs" "$OUT/logs" || exit 2
# Price the plan and check the data budget before any run starts; the table is kept with the results.
price_plan > "$OUT/plan.txt" || exit 2
touch "$RESULTS"
SLOT_PID=()
SLOT_NAME=()
SLOT_LOGSIZE=()
FAILED=()
BUSY=()
TRAINED=0
DONE=0
REUSED=0
RESTORED=0

reap() {  # collect finished runs; one failure is recorded and the sweep goes on
  local i pid rc name said
  for i in "${!SLOT_PID[@]}"; do
    pid="${SLOT_PID[$i]}"
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"; rc=$?
      name="${SLOT_NAME[$i]}"
      echo "[$(date -u +%FT%TZ)] exit $rc" >> "$OUT/logs/$name.log"  # the attempt's end, for --status
      # What train.py said this time (the log is appended to, so read only the new part).
      said=$(tail -c +$(( SLOT_LOGSIZE[i] + 1 )) "$OUT/logs/$name.log" | grep -oE -m 1 '(already done|reused|restored|busy):')
      case "$rc:$said" in
        0:"already done:") DONE=$((DONE + 1)) ;;
        0:reused:) REUSED=$((REUSED + 1)); echo "[$(date +%H:%M:%S)] reused $name" ;;
        0:restored:) RESTORED=$((RESTORED + 1)); echo "[$(date +%H:%M:%S)] restored $name (its row, from final.json)" ;;
        0:*) TRAINED=$((TRAINED + 1)); echo "[$(date +%H:%M:%S)] done $name" ;;
        75:*) BUSY+=("$name"); echo "[$(date +%H:%M:%S)] busy $name (another process is training it)" ;;
        *) FAILED+=("$name (exit $rc, log $OUT/logs/$name.log)"); echo "[$(date +%H:%M:%S)] FAILED $name (exit $rc)" ;;
      esac
      SLOT_PID[$i]=""
    fi
  done
}

# How often a waiting sweep looks for finished runs: a run that ends waits up to this long for its slot to be
# refilled (one second was most of a 56-run test sweep's minute; checking costs one `sleep` and kill -0's).
POLL_S=0.2

wait_for_slot() {  # sets SLOT to a free slot index (no subshell: SLOT_PID must stay ours)
  local i
  while true; do
    reap
    for (( i = 0; i < SLOTS; i++ )); do
      if [ -z "${SLOT_PID[$i]:-}" ]; then SLOT=$i; return; fi
    done
    sleep "$POLL_S"
  done
}

trap 'echo "sweep.sh: interrupted; running jobs checkpoint on SIGTERM, rerun to resume" >&2; kill -TERM $(jobs -p) 2>/dev/null; wait; exit 130' INT TERM

# Longest runs first, so that the slots finish together instead of one slot running the largest budget alone at
# the end (greedy longest-processing-time scheduling). A run's wall time grows with its compute (plan.txt's F*D,
# flops.py's) and, at one compute, falls with width (fewer, slightly slower steps); the grids list widths in
# ascending order, so a stable sort on F*D, largest first, is that order. The plan, --print and SLURM's array keep
# the grid's.
mapfile -t RUN_ORDER < <(for line in "${LINES[@]}"; do
                           echo "$(awk -v name="${line%%|*}" '$1 == name { print $11 }' "$OUT/plan.txt") $line"
                         done | sort -s -g -r -k1,1 | cut -d' ' -f2-)

for line in "${RUN_ORDER[@]}"; do
  name="${line%%|*}"; flags="${line#*|}"
  wait_for_slot
  cmd=$(train_command "$name" "$flags" "$SLOT")
  if [ "$GPUS" -gt 0 ]; then  # concurrent runs on one node need their own rendezvous ports
    cmd="${cmd/torchrun --standalone/torchrun --rdzv-backend=c10d --rdzv-endpoint=localhost:$((29500 + SLOT))}"
  fi
  log="$OUT/logs/$name.log"
  SLOT_LOGSIZE[$SLOT]=$(stat -c %s "$log" 2>/dev/null || echo 0)
  echo "[$(date -u +%FT%TZ)] $cmd" >> "$log"
  bash -c "$cmd" >> "$log" 2>&1 &
  SLOT_PID[$SLOT]=$!; SLOT_NAME[$SLOT]="$name"
done
while [ -n "$(printf '%s' "${SLOT_PID[@]:-}")" ]; do reap; sleep "$POLL_S"; done

echo "sweep $GRID: ${#LINES[@]} configurations: $TRAINED trained now, $DONE already done, $REUSED reused," \
     "$RESTORED restored, ${#BUSY[@]} busy, ${#FAILED[@]} failed"
for b in "${BUSY[@]}"; do echo "  busy (locked by another live process; rerun later): $b"; done
for f in "${FAILED[@]}"; do echo "  failed: $f"; done

if [ -z "${NO_FIT:-}" ]; then
  if ! run_fit && [ "${#FAILED[@]}" -eq 0 ]; then exit 1; fi
fi
[ "${#FAILED[@]}" -eq 0 ] && [ "${#BUSY[@]}" -eq 0 ]
