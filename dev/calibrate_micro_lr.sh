#!/usr/bin/env bash
# Re-anchor the LR transfer rule at CPU scale (as App. E anchors the paper at s = 10): at the micro reference (d = 32, B = 2048
# tokens, D ~ 5e5 tokens; C = 1.5e12 FLOPs) sweep the MuonH base LR for r = 1 and r = 4, keeping
# the paper's exponents and AdamW bases. The best base LR is what sweep.sh's cpu-micro grid uses.
#
#   bash dev/calibrate_micro_lr.sh            # 12 runs, ~10 min on 2 cores; rows in dev/results/lr_calibration.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-runs/lr-calibration}" RESULTS="${RESULTS:-dev/results/lr_calibration.jsonl}" CPU_JOBS="${CPU_JOBS:-2}"
LRS="${LRS:-0.007 0.014 0.028 0.056 0.112 0.224}"
for r in 1 4; do for lr in $LRS; do echo "r${r}_lr$lr --r $r --scale 0.5 --lr-matrix $lr"; done; done | bash dev/micro_runs.sh
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
