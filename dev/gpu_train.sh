#!/usr/bin/env bash
# train.py end to end on one GPU, on real text: its own tokens/s and MFU (the progress line's) at s = 10 for
# r = 4, r = 1 and r = 4 untied under --compile, and how long a SIGINT takes to stop a GPU run mid-step.
# dev/gpu_check.py measures the step in isolation on random tokens; this is the whole script (data loader,
# gradient accumulation, validation, checkpoint) as a user runs it. The GPU box has no network, so the data is
# built here first and carried (32,768-token BPE of the micro-corpus, 2,048-token rows, 3.9M training tokens):
#
#   python prepare_data.py --source data/micro-corpus/fineweb-web.jsonl.xz --out data/gpu-32k \
#       --vocab-size 32768 --seq-len 2048 --val-fraction 0.03
#   OUT=... bash dev/gpu_train.sh     # ~5 min on an H200: train_s10.log and train_s10.jsonl in $OUT
#
# Each part runs whatever the one before did (a failure is logged with its exit status), so one call on a lent
# machine brings back every number it can.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-dev/results/gpu_check}
DATA=${DATA:-data/gpu-32k}
LOG=$OUT/train_s10.log
ROWS=$OUT/train_s10.jsonl
RUNS=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# 30 steps of 131,072 tokens (64 rows of 2,048): one pass over the 3.9M training tokens
COMMON="--scale 10 --data $DATA --batch-tokens 131072 --tokens 3932160 --log-every 5 --results $ROWS"

for arm in "r4:--r 4" "r1:--r 1" "r4_untied:--r 4 --untied"; do
  name=${arm%%:*}
  echo "== $name compiled: python3 train.py ${arm#*:} $COMMON --compile" | tee -a "$LOG"
  python3 train.py ${arm#*:} $COMMON --compile --out "$RUNS/$name" >>"$LOG" 2>&1
  echo "== $name exit $?" | tee -a "$LOG"
done

# A stop on the GPU: an eager r = 4 run with a long horizon, SIGINT once its fifth step is logged.
echo "== stop: SIGINT after step 5 of an eager r = 4 run" | tee -a "$LOG"
python3 train.py --r 4 --scale 10 --data "$DATA" --batch-tokens 131072 --tokens 39321600 --log-every 1 \
  --out "$RUNS/stop" --results "$RUNS/stop.jsonl" >"$RUNS/stop.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q "^step *5/" "$RUNS/stop.log" && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.2
done
sent=$(date +%s.%N)
kill -INT $pid
wait $pid
status=$?
done_at=$(date +%s.%N)
cat "$RUNS/stop.log" >>"$LOG"
echo "== stop exit $status, $(python3 -c "print(f'{$done_at - $sent:.1f}')") s from SIGINT to exit; files: $(ls "$RUNS/stop" | tr "\n" " ")" | tee -a "$LOG"
rm -rf "$RUNS"
