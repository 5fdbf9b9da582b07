#!/usr/bin/env bash
# Train one CPU-scale run per line of stdin, "NAME train.py-flags...", at the cpu-micro settings of
# sweep.sh (C = 1.5e12 FLOPs, head dim 8, 2,048-token steps, the micro LR reference, 1,024 validation
# rows); a line's own flags come last and win (e.g. --flops 5e12). CPU_JOBS runs at a time, one thread
# each. Rows go to $RESULTS, run folders and logs to $OUT/NAME. Finished runs are "already done" (their
# row is in $RESULTS), so a killed batch is rerun with the same command. Used by calibrate_micro_lr.sh
# and diagnose_micro.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${DATA:-data/micro-2k}"
: "${OUT:?set OUT}" "${RESULTS:?set RESULTS}"
FLAGS="--flops 1.5e12 --head-dim 8 --batch-tokens 2048 --ref-width 32 --ref-batch 2048 --ref-tokens 5e5 --eval-rows 1024 --log-every 100"
[ -f "$DATA/meta.json" ] || { echo "$DATA/meta.json missing: python prepare_data.py --source data/micro-corpus --vocab-size 2048 --seq-len 128 --val-fraction 0.02 --out $DATA" >&2; exit 2; }
[[ "${CPU_JOBS:-1}" =~ ^[1-9][0-9]*$ ]] || { echo "CPU_JOBS must be a whole number >= 1, got '$CPU_JOBS'" >&2; exit 2; }
mkdir -p "$OUT" "$(dirname "$RESULTS")"
# A name whose row is in $RESULTS is skipped before train.py starts: the older rows carry no run identity
# for train.py's own "already done" check to match, and it would train them again.
OMP_NUM_THREADS=1 xargs -P "${CPU_JOBS:-1}" -L 1 bash -c 'name=$0;
  grep -qF "\"out\": \"'"$OUT"'/$name\"" '"$RESULTS"' 2>/dev/null && { echo "done: $name (row in '"$RESULTS"')"; exit 0; }
  python3 train.py --data '"$DATA"' '"$FLAGS"' "$@" --out '"$OUT"'/$name --results '"$RESULTS"' --resume \
    >> '"$OUT"'/$name.log 2>&1 && echo "done: $name" || echo "failed: $name (see '"$OUT"'/$name.log)"'
