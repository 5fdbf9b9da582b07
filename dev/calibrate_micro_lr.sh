#!/usr/bin/env bash
# Re-anchor the LR transfer rule at CPU scale (RECIPE §6): at the micro reference (d = 32, B = 2048
# tokens, D ~ 5e5 tokens; C = 1.5e12 FLOPs) sweep the MuonH base LR for r = 1 and r = 4, keeping
# the paper's exponents and AdamW bases. The best base LR is what sweep.sh's cpu-micro grid uses.
#
#   bash dev/calibrate_micro_lr.sh            # 12 runs, ~10 min on 2 cores; rows in dev/results/lr_calibration.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${DATA:-data/micro-2k}"
OUT="${OUT:-runs/lr-calibration}"
RESULTS="${RESULTS:-dev/results/lr_calibration.jsonl}"
LRS="${LRS:-0.007 0.014 0.028 0.056 0.112 0.224}"
[ -f "$DATA/meta.json" ] || { echo "$DATA/meta.json missing: python prepare_data.py --source ../shared/data/micro-corpus --vocab-size 2048 --seq-len 128 --val-fraction 0.02 --out $DATA" >&2; exit 2; }
[[ "${CPU_JOBS:-2}" =~ ^[1-9][0-9]*$ ]] || { echo "CPU_JOBS must be a whole number >= 1, got '$CPU_JOBS'" >&2; exit 2; }
mkdir -p "$OUT" "$(dirname "$RESULTS")"
for r in 1 4; do for lr in $LRS; do echo "$r $lr"; done; done |
  OMP_NUM_THREADS=1 xargs -P "${CPU_JOBS:-2}" -L 1 bash -c 'python3 train.py --data '"$DATA"' --r $0 --scale 0.5 \
    --flops 1.5e12 --head-dim 8 --batch-tokens 2048 --ref-width 32 --ref-batch 2048 --ref-tokens 5e5 \
    --eval-rows 1024 --log-every 100 --lr-matrix $1 --out '"$OUT"'/r$0_lr$1 --results '"$RESULTS"' --resume \
    > '"$OUT"'/r$0_lr$1.log 2>&1 || echo "failed: r=$0 lr=$1 (see '"$OUT"'/r$0_lr$1.log)"'
python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'r':>3}{'MuonH LR of the run':>21}{'val loss':>10}")
for r in sorted({x["r"] for x in rows}):
    sub = sorted((x for x in rows if x["r"] == r), key=lambda x: x["lrs"]["matrix"])
    best = min(sub, key=lambda x: x["val_loss"])
    for x in sub:
        print(f"{r:>3}{x['lrs']['matrix']:>21.4g}{x['val_loss']:>10.4f}{'  <- best' if x is best else ''}")
PY
