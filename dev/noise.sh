#!/usr/bin/env bash
# The noise of the CPU grid by source, at the cells an ablation compares (#50): each cell trained with seeds
# 0..K-1 under each candidate recipe, so that every (cell, recipe) has a seed sd, and seed 0 of the base recipe
# is the committed cpu-micro run retrained (the same run_id: what kernel rounding alone moves). The data order is
# the same in every run (dataloader.ROW_ORDER_SEED), so a seed changes the initialisation only; the "order"
# recipe keeps seed 0 and reads the rows in order i + 1 instead (train.py --data-order): the data order alone.
# dev/study_tables.py prints the table (seed sd and mean loss per cell and recipe, the retrain's |delta|).
#
#   bash dev/noise.sh                                   # the default cells, recipes and seeds (resumes)
#   CELLS="1.1e12:4:0.25" RECIPES="base cosine" SEEDS="0 1 2" bash dev/noise.sh
#
# Environment: CELLS ("budget:r:scale" ...), RECIPES (names from recipe_flags below), SEEDS, CPU_JOBS (2),
# OUT (dev/results/cpu-micro-noise), PYTHON. Every finished run is kept: rerun to finish or to add seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
CPU_JOBS="${CPU_JOBS:-2}"
OUT="${OUT:-dev/results/cpu-micro-noise}"
CELLS="${CELLS:-1.1e12:1:0.25 1.1e12:4:0.25}"
RECIPES="${RECIPES:-base cosine lowlr}"
SEEDS="${SEEDS:-0 1 2 3 4}"
DATA=data/micro-2k
recipe_flags() {  # a candidate recipe's train.py flags, after the grid's (a later flag wins in train.py)
  case "$1" in
    base) echo "" ;;                                          # the cpu-micro grid as committed
    cosine) echo "--warmup-frac 0.1 --lr-decay cosine" ;;     # Truncate or Not?'s schedule shape
    lowlr) echo "--lr-matrix 0.028" ;;                        # half the grid's MuonH LR
    cosine-avg) echo "--warmup-frac 0.1 --lr-decay cosine --average-last 0.2" ;;  # + the last 20% averaged
    order) echo "" ;;                                         # the base; its "seed" is the data order's
    avg) echo "--average-last 0.2" ;;                         # the grid's schedule, the last 20% averaged
    lr014) echo "--lr-matrix 0.014" ;;                        # the looped runs' own best LR (cpu-micro-lr)
    cosine-avg-lr014) echo "$QUIET_FLAGS" ;;                  # the quiet recipe (sweep.sh CPU_QUIET_FLAGS)
    quiet-lr007) echo "$QUIET_FLAGS --lr-matrix 0.007" ;;     # the quiet recipe at half its MuonH LR
    quiet-b4096) echo "$QUIET_FLAGS --batch-tokens 4096" ;;   # the quiet recipe in steps of twice the tokens
    *) echo "noise.sh: unknown recipe '$1' (base, order, cosine, lowlr, avg, cosine-avg, lr014, cosine-avg-lr014, quiet-lr007, quiet-b4096)" >&2
       return 2 ;;
  esac
}
GRID_FLAGS=$(sed -n 's/^CPU_MICRO_FLAGS="\(.*\)"$/\1/p' sweep.sh)  # the grid's flags, from their one place
[ -n "$GRID_FLAGS" ] || { echo "noise.sh: CPU_MICRO_FLAGS not found in sweep.sh" >&2; exit 2; }
QUIET_FLAGS=$(sed -n 's/^CPU_QUIET_FLAGS="\(.*\)"$/\1/p' sweep.sh)
if [ ! -f "$DATA/meta.json" ]; then  # built from the repository's sources with the grid's flags (sweep.sh's)
  data_flags=$(grep -A1 '^  cpu-micro\*|' sweep.sh | sed -n 's/^ *DATA_FLAGS="\(.*\)" ;;$/\1/p')
  # shellcheck disable=SC2086
  "$PYTHON" prepare_data.py $data_flags --out "$DATA"
fi
mkdir -p "$OUT/runs" "$OUT/logs"
jobs_file=$(mktemp)  # this invocation's runs (another may share OUT after it)
: > "$jobs_file"
for recipe in $RECIPES; do
  flags=$(recipe_flags "$recipe")
  for cell in $CELLS; do
    IFS=: read -r budget r s <<< "$cell"
    for seed in $SEEDS; do
      name="r${r}_s${s}_C${budget}_${recipe}_seed${seed}_micro"
      seed_flags="--seed $seed"
      if [ "$recipe" = order ]; then seed_flags="--seed 0 --data-order $((seed + 1))"; fi
      echo "$name|--r $r --scale $s --flops $budget $GRID_FLAGS $flags $seed_flags" >> "$jobs_file"
    done
  done
done
run_one() {  # one "name|flags" line: train.py into OUT/runs/NAME, its output into OUT/logs/NAME.log
  local name="${1%%|*}" flags="${1#*|}"
  # shellcheck disable=SC2086
  if "$PYTHON" train.py --data "$DATA" --out "$OUT/runs/$name" --results "$OUT/results.jsonl" --resume --compile \
       $flags > "$OUT/logs/$name.log" 2>&1; then
    echo "noise.sh: $name: $(tail -n 3 "$OUT/logs/$name.log" | grep -m1 -o 'final val loss [0-9.]*' || tail -n 1 "$OUT/logs/$name.log")"
  else
    echo "noise.sh: $name failed: $(tail -n 1 "$OUT/logs/$name.log")" >&2
  fi
}
export -f run_one
export PYTHON DATA OUT
echo "noise.sh: $(wc -l < "$jobs_file") runs into $OUT on $CPU_JOBS slots ($(date -u +%FT%TZ))"
tr '\n' '\0' < "$jobs_file" | xargs -0 -P "$CPU_JOBS" -I{} bash -c 'run_one "$1"' _ {}
rm "$jobs_file"
echo "noise.sh: done $(date -u +%FT%TZ)"
